"""Token-exact records (``envsdk rollout --tokens``) from the tiny local model: the rebuilt
sequence is, token for token, what the model's own ``generate`` produced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envsdk.tokens import rebuild, token_turn
from tests.cli.conftest import envsdk, user_env
from tests.eval.conftest import records

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(300)

SEED, MAX_NEW = 11, 200
# A seeded sampling policy: its n-th generation draws from SEED + n, so a replay can repeat it.
POLICY = f"""\
import os
from envsdk.policies.hf import TransformersPolicy

class Sampled(TransformersPolicy):
    def __init__(self):
        super().__init__(os.environ["TINY_MODEL"], do_sample=True, seed={SEED}, max_new_tokens={MAX_NEW})
"""


def test_token_exact_records_rebuild_what_the_model_generated(tmp_path: Path) -> None:
    from envsdk.tiny_model import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny")
    (tmp_path / "sampled.py").write_text(POLICY, encoding="utf-8")
    env = {**user_env(), "TINY_MODEL": str(model_dir)}
    run = envsdk(
        "rollout", "--env", "frozen_lake", "--policy", "sampled.py:Sampled", "--episodes", "2", "--max-turns", "2",
        "--concurrency", "1", "--tokens", "--no-progress", cwd=tmp_path, env=env,
    )
    assert run.returncode == 0, run.stderr
    saved = records(tmp_path / "completions.jsonl")

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    model.eval()
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    call = 0  # one episode at a time: the policy's calls are the records' turns in order
    continued = 0
    retokenised_differs = 0
    for record in saved:
        tokens = record["tokens"]
        assert [t["turn"] for t in tokens] == list(range(1, record["turns"] + 1))
        users = [m for m in record["messages"] if m["role"] == "user"]
        opening = record["messages"][: next(i for i, m in enumerate(record["messages"]) if m["role"] == "assistant")]
        first = tokenizer.apply_chat_template(opening, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert tokens[0]["prompt_ids"] == list(first)
        for t, entry in enumerate(tokens):
            if t:
                # Later turns continue the model's own tokens with what the environment added.
                assert "prompt_ids" not in entry
                assert users[t]["content"] in tokenizer.decode(entry["env_ids"])
                continued += 1
            context = rebuild(tokens[:t]).ids + entry["env_ids"] if t else entry["prompt_ids"]
            with torch.random.fork_rng(devices=[]), torch.inference_mode():
                torch.manual_seed(SEED + call)
                out = model.generate(
                    input_ids=torch.tensor([context]), attention_mask=torch.ones(1, len(context), dtype=torch.long),
                    do_sample=True, temperature=1.0, max_new_tokens=MAX_NEW, pad_token_id=eos[0], eos_token_id=eos,
                    output_scores=True, return_dict_in_generate=True,
                )
            call += 1
            generated = out.sequences[0, len(context):].tolist()
            assert entry["completion_ids"] == generated, f"turn {t + 1} of {record['uuid']}"
            replayed = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)[0].tolist()
            assert entry["logprobs"] == pytest.approx(replayed, abs=1e-4)
            assert all(lp <= 0.0 for lp in entry["logprobs"])
        whole = rebuild(tokens)
        assert len(whole.ids) == len(whole.mask) == len(whole.logprobs)
        assert sum(whole.mask) == sum(len(t["completion_ids"]) for t in tokens)
        # What a trainer re-tokenising the saved messages would have trained on instead.
        retemplated = tokenizer.apply_chat_template(record["messages"], tokenize=True, return_dict=False)
        retokenised_differs += list(retemplated) != whole.ids[: len(retemplated)]
    assert continued >= 1, "no episode had a second turn: nothing showed the environment's tokens"
    assert retokenised_differs == len(saved)


def test_token_turns_restart_where_a_prompt_does_not_continue_the_last_turn() -> None:
    first = token_turn([], 1, [1, 2, 3], [4, 5], [-0.1, -0.2])
    second = token_turn([first], 2, [1, 2, 3, 4, 5, 6], [7], None)
    assert second["env_ids"] == [6] and second["logprobs"] is None
    rebuilt = rebuild([first, second])
    assert rebuilt.ids == [1, 2, 3, 4, 5, 6, 7] and rebuilt.mask == [0, 0, 0, 1, 1, 0, 1]
    assert rebuilt.logprobs == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0]
    # A server that re-tokenised the transcript: the turn restarts the sequence.
    third = token_turn([first, second], 3, [1, 2, 9, 9], [8], [-1.0])
    assert third["prompt_ids"] == [1, 2, 9, 9] and rebuild([first, second, third]).ids == [1, 2, 9, 9, 8]


def test_tokens_with_a_policy_that_has_none_say_so(tmp_path: Path) -> None:
    run = envsdk("rollout", "--env", "frozen_lake", "--episodes", "1", "--tokens", "--no-progress", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "gives no token ids" in run.stderr
    assert "tokens" not in json.loads((tmp_path / "completions.jsonl").read_text().splitlines()[0])


def test_tokens_with_a_server_that_returns_no_ids_play_on_without_them(tmp_path: Path) -> None:
    """`transformers serve` refuses vLLM's ``return_token_ids`` (HTTP 422): the policy asks again
    without it, the episodes play, and their records carry no tokens."""
    import shutil
    import subprocess
    import sys
    import time

    import httpx

    from envsdk.testing import free_port, stop_process
    from envsdk.tiny_model import build_tiny_model

    cli = shutil.which("transformers", path=str(Path(sys.executable).parent))
    if cli is None:
        pytest.skip("the `transformers` CLI is not installed (needs transformers[serving])")
    model_dir = build_tiny_model(tmp_path / "tiny")
    port = free_port()
    proc = subprocess.Popen(
        [cli, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        env={**user_env(), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        model_id = None
        while model_id is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                model_id = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()["data"][0]["id"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError):
                time.sleep(0.25)
        assert model_id is not None, "transformers serve did not start"
        run = envsdk(
            "rollout", "--env", "frozen_lake", "--policy", "openai", "--api-base", f"http://127.0.0.1:{port}/v1",
            "--model", str(model_id), "--episodes", "2", "--max-turns", "1", "--tokens", "--no-progress", cwd=tmp_path,
        )
    finally:
        stop_process(proc)
    assert run.returncode == 0, run.stderr
    saved = records(tmp_path / "completions.jsonl")
    assert len(saved) == 2 and all(r["status"] != "error" for r in saved)
    assert all("tokens" not in r for r in saved)


def test_a_vllm_style_reply_gives_its_token_ids_and_logprobs() -> None:
    """The fields vLLM adds when asked (``return_token_ids``, ``logprobs``) become the output's ids."""
    from envsdk.policies.openai_chat import OpenAIChatPolicy, _parse_completion

    policy = OpenAIChatPolicy("http://127.0.0.1:9/v1", "m", api_key="")
    assert "return_token_ids" not in policy.request_body([])
    policy.token_exact = True
    assert policy.request_body([])["return_token_ids"] is True and policy.request_body([])["logprobs"] is True
    body = {
        "prompt_token_ids": [5, 6, 7],
        "choices": [{
            "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop", "token_ids": [8, 9],
            "logprobs": {"content": [{"token": "h", "logprob": -0.5}, {"token": "i", "logprob": -1.25}]},
        }],
    }
    out = _parse_completion("u", json.dumps(body))
    assert (out.prompt_ids, out.completion_ids, out.logprobs) == ([5, 6, 7], [8, 9], [-0.5, -1.25])
    body["choices"][0]["logprobs"]["content"].pop()  # one logprob short: none rather than misaligned ones
    assert _parse_completion("u", json.dumps(body)).logprobs is None
    del body["prompt_token_ids"]  # ids of half the sequence are no use
    assert _parse_completion("u", json.dumps(body)).completion_ids is None
