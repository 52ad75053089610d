"""A tiny, randomly initialised causal language model with a locally trained tokenizer.

For tests and CPU demos only: the model produces gibberish, but it is a real transformers model
with a real chat template, so anything that loads a checkpoint directory (``TransformersPolicy``,
``transformers serve``, TRL's ``GRPOTrainer``) runs on it end to end, offline, in about a second.
Nothing is downloaded: the tokenizer is trained on text generated here.

Needs the ``train`` extra (torch, transformers, tokenizers). From the shell:
``python -m envsdk.tiny_model DIR`` builds one into DIR, and says in one line what is missing
(the extra, a DIR that is a file) rather than with a traceback.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Literal

try:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedModel,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    _NEEDS = (
        "envsdk.tiny_model needs torch, transformers and tokenizers (envsdk's [train] extra): "
        "pip install -e '.[train]' in the envsdk clone (or pip install torch transformers tokenizers)"
    )
    if __name__ == "__main__":  # `python -m envsdk.tiny_model DIR`: one line, no traceback
        raise SystemExit(f"python -m envsdk.tiny_model: error: {_NEEDS}") from None
    raise ImportError(_NEEDS) from exc

from envsdk.games.sudoku import render_board

__all__ = ["build_tiny_model", "build_tiny_tokenizer", "CHAT_TEMPLATE", "RESPONSE_TEMPLATE", "SPECIAL_TOKENS"]

Arch = Literal["qwen2", "llama"]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# ChatML, as Qwen uses it: the assistant turn ends with <|im_end|>, which is also the EOS token,
# so a generation that "finishes its turn" stops at EOS. Tool calling in Qwen's form, so that
# TRL's environment_factory (which checks that a template renders a whole tool-calling exchange)
# runs on the tiny model: with `tools`, a system block lists them; an assistant's `tool_calls`
# become <tool_call>{"name", "arguments"}</tool_call> lines; a `tool` message is a user turn in
# <tool_response>. A conversation without tools renders exactly as plain ChatML.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call one or more functions. Their signatures, within <tools></tools>:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each call, reply with a JSON object within <tool_call></tool_call> tags:\n"
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- set arguments = fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + arguments + '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# How a generated assistant turn is read back into a message (transformers' `parse_response`,
# which TRL uses to find tool calls): Qwen's form, as the template writes it.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": "</tool_call>\\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": "<\\|im_end\\|>\\s*", "content": "text"},
    },
}

_VOCAB_SIZE = 600
_MAX_POSITIONS = 4096


def _corpus(seed: int) -> list[str]:
    """A few KB of text shaped like what the model will see: Sudoku boards and moves,
    FrozenLake grids and actions, chat roles."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(6):
        board = [[rng.choice([0, 0, 0, *range(1, 10)]) for _ in range(9)] for _ in range(9)]
        lines.append(render_board(board))
        r, c, n = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
        lines.append(f"Submit your move as [row col number], for example [{r} {c} {n}].")
        lines.append("You attempted an invalid move. Please resubmit a valid move.")
    directions = ["up", "down", "left", "right"]
    for _ in range(6):
        size = rng.choice([4, 5, 6])
        grid = [[rng.choice("FFFH") for _ in range(size)] for _ in range(size)]
        grid[0][0], grid[-1][-1] = "S", "G"
        lines.append("\n".join(" ".join(row) for row in grid))
        lines.append(f"FrozenLake: reach the goal G. <action>{rng.choice(directions)}</action>")
    lines.append("system user assistant Step Progress cells filled GUARANTEED MOVES 0123456789")
    return lines


def build_tiny_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on generated text, with ChatML special tokens.

    Byte level means any input text can be encoded; the specials are single tokens.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        model_max_length=_MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.response_template = RESPONSE_TEMPLATE
    return fast


def _tiny_model(arch: Arch, vocab_size: int, eos_id: int, pad_id: int) -> PreTrainedModel:
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=_MAX_POSITIONS,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common))
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    raise ValueError(f"unknown arch {arch!r}; expected 'qwen2' or 'llama'")


def build_tiny_model(out_dir: str | Path, *, arch: Arch = "qwen2", seed: int = 0) -> Path:
    """Build a random tiny causal LM (hidden 32, 2 layers, 2 heads) and its tokenizer, and
    ``save_pretrained`` both into `out_dir` (created if missing). Returns `out_dir` as a Path.

    The same `seed` gives the same tokenizer and weights. The directory loads with
    ``AutoTokenizer``/``AutoModelForCausalLM`` and is served by ``transformers serve DIR``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer(seed)
    eos_id = int(tokenizer.convert_tokens_to_ids(IM_END))  # type: ignore[arg-type]
    pad_id = int(tokenizer.convert_tokens_to_ids(PAD_TOKEN))  # type: ignore[arg-type]
    # fork_rng: seeding the weights must not reseed the caller's global torch generator.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _tiny_model(arch, len(tokenizer), eos_id, pad_id)
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None, do_sample=False
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m envsdk.tiny_model DIR [--arch qwen2|llama] [--seed N]``: build the tiny model
    into DIR; 0 when built, 2 (one line on stderr) when DIR cannot hold it."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m envsdk.tiny_model", description="Build the tiny local model.")
    parser.add_argument("out_dir", metavar="DIR", help="folder to save the model and its tokenizer into")
    parser.add_argument("--arch", choices=("qwen2", "llama"), default="qwen2")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        out = build_tiny_model(args.out_dir, arch=args.arch, seed=args.seed)
    except OSError as exc:
        parser.exit(2, f"{parser.prog}: error: cannot write {args.out_dir}: {exc.strerror or exc}\n")
    print(f"tiny model written to {out} (load it with --model {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
