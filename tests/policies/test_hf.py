"""TransformersPolicy and the tiny model: real generation on CPU, finish reasons, seeding."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="needs transformers (envsdk[train])")
torch = pytest.importorskip("torch", reason="needs torch (envsdk[train])")

from envsdk.policies import PolicyError, make_policy  # noqa: E402
from envsdk.policies.hf import TransformersPolicy  # noqa: E402
from envsdk.tiny_model import IM_END, build_tiny_model  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "You play FrozenLake."},
    {"role": "user", "content": "P F H\nF F F\nH F G\nWhat is your move?"},
]


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> TransformersPolicy:
    return TransformersPolicy(tiny_model_dir, device="cpu", max_new_tokens=8, do_sample=True, seed=5)


@pytest.mark.timeout(60)
async def test_generates_text_cut_by_max_new_tokens(policy: TransformersPolicy) -> None:
    out = await policy.act_ex(MESSAGES)
    assert isinstance(out.text, str) and out.text
    # A random model does not end its turn on its own within 8 tokens.
    assert out.finish_reason == "length"
    assert out.completion_tokens == 8
    assert out.prompt_tokens is not None and out.prompt_tokens > 10


@pytest.mark.timeout(60)
async def test_tiny_max_new_tokens_reports_length(tiny_model_dir: Path) -> None:
    policy = make_policy(
        "transformers", "frozen_lake", model_path=tiny_model_dir, max_new_tokens=1, do_sample=False
    )
    out = await policy.act_ex(MESSAGES)
    assert out.finish_reason == "length" and out.completion_tokens == 1
    await policy.aclose()


@pytest.mark.timeout(60)
async def test_a_reply_ending_in_eos_reports_stop(tiny_model_dir: Path) -> None:
    policy = TransformersPolicy(tiny_model_dir, max_new_tokens=8, do_sample=False)
    assert policy.model is not None
    eos_id = policy.tokenizer.convert_tokens_to_ids(IM_END)
    # Rewire the output layer so that every position predicts end-of-turn: the real generate
    # loop must then stop after one token and say so.
    head = torch.nn.Linear(policy.model.config.hidden_size, policy.model.config.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[eos_id] = 10.0
    policy.model.lm_head = head
    out = await policy.act_ex(MESSAGES)
    assert out.finish_reason == "stop"
    assert out.completion_tokens == 1 and out.text == ""
    await policy.aclose()


@pytest.mark.timeout(60)
async def test_same_seed_gives_the_same_replies(tiny_model_dir: Path) -> None:
    a = TransformersPolicy(tiny_model_dir, max_new_tokens=6, seed=11)
    b = TransformersPolicy(tiny_model_dir, max_new_tokens=6, seed=11)
    replies_a = [await a.act(MESSAGES) for _ in range(2)]
    replies_b = [await b.act(MESSAGES) for _ in range(2)]
    assert replies_a == replies_b
    # The n-th call draws from seed + n, so consecutive replies differ.
    assert replies_a[0] != replies_a[1]


@pytest.mark.timeout(60)
async def test_unseeded_sampling_varies_between_calls(tiny_model_dir: Path) -> None:
    policy = TransformersPolicy(tiny_model_dir, max_new_tokens=6, seed=None)
    replies = {await policy.act(MESSAGES) for _ in range(3)}
    assert len(replies) > 1


@pytest.mark.timeout(60)
async def test_seeding_leaves_the_global_torch_generator_alone(policy: TransformersPolicy) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    await policy.act(MESSAGES)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.timeout(60)
async def test_concurrent_calls_all_complete(policy: TransformersPolicy) -> None:
    outputs = await asyncio.gather(*(policy.act_ex(MESSAGES) for _ in range(4)))
    assert [o.completion_tokens for o in outputs] == [8] * 4


@pytest.mark.timeout(60)
async def test_closed_policy_refuses_to_generate(tiny_model_dir: Path) -> None:
    policy = TransformersPolicy(tiny_model_dir, max_new_tokens=2)
    await policy.aclose()
    await policy.aclose()  # idempotent
    with pytest.raises(PolicyError, match="closed"):
        await policy.act(MESSAGES)


@pytest.mark.timeout(60)
def test_tiny_model_is_deterministic_and_loads_as_llama_too(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    llama = build_tiny_model(tmp_path / "llama", arch="llama", seed=3)
    model = AutoModelForCausalLM.from_pretrained(llama)
    tokenizer = AutoTokenizer.from_pretrained(llama)
    assert model.config.model_type == "llama"
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\nYou play FrozenLake.<|im_end|>\n")
    assert prompt.endswith("<|im_start|>assistant\n")
    # Byte level: any text, digits and brackets included, round-trips through the tokenizer.
    text = "[3 7 9] <action>left</action> é"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
