"""OpenAIChatPolicy against a real OpenAI-compatible server: `transformers serve` on the tiny model.

A small FastAPI app stands in only where the real server cannot show the behaviour: how many
requests the policy keeps in flight, and a 200 answer that is not a chat completion.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from envsdk.policies import make_policy
from envsdk.policies.openai_chat import (
    InferenceConnectionError,
    InferenceResponseError,
    InferenceResponseTooLargeError,
    InferenceServerError,
    InferenceTimeoutError,
    OpenAIChatPolicy,
    chat_completions_url,
)
from envsdk.testing import free_port, running_server, stop_process

MESSAGES = [
    {"role": "system", "content": "You play Sudoku."},
    {"role": "user", "content": "R1  4  8  . |  9  5  7 |  2  .  1\nYour move?"},
]


@pytest.fixture(scope="module")
def served_model(tiny_model_dir: Path) -> Iterator[tuple[str, str]]:
    """``(base_url, model_id)`` of `transformers serve` running the tiny model on loopback."""
    cli = shutil.which("transformers", path=str(Path(sys.executable).parent))
    if cli is None:
        pytest.skip("the `transformers` CLI is not installed (needs transformers[serving])")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen(
        [cli, "serve", str(tiny_model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        model_id = _wait_for_models(proc, base_url, deadline_s=120.0)
        yield base_url, model_id
    finally:
        stop_process(proc, 10)
        if proc.stderr is not None:
            proc.stderr.close()


def _wait_for_models(proc: subprocess.Popen[bytes], base_url: str, deadline_s: float) -> str:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            pytest.fail(f"transformers serve exited with {proc.returncode}: {err[-2000:]}")
        try:
            reply = httpx.get(f"{base_url}/v1/models", timeout=2.0)
            if reply.status_code == 200:
                return str(reply.json()["data"][0]["id"])
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    pytest.fail(f"transformers serve did not answer GET /v1/models within {deadline_s} s")


@pytest.mark.timeout(180)
async def test_concurrent_replies_from_transformers_serve(served_model: tuple[str, str]) -> None:
    base_url, model = served_model
    async with OpenAIChatPolicy(base_url, model, max_tokens=6, seed=1, concurrency=3, timeout=60) as policy:
        outputs = await asyncio.gather(*(policy.act_ex(MESSAGES) for _ in range(4)))
    for out in outputs:
        assert isinstance(out.text, str) and out.text
        assert out.finish_reason in ("stop", "length")
        assert out.prompt_tokens is not None and out.prompt_tokens > 0
        # A random model almost never ends its turn by itself: the 6-token limit cuts it.
        assert out.finish_reason == "length" and out.completion_tokens == 6


@pytest.mark.timeout(180)
async def test_act_returns_the_reply_text_with_a_v1_base_url(served_model: tuple[str, str]) -> None:
    base_url, model = served_model
    policy = make_policy("openai", "sudoku", base_url=f"{base_url}/v1/", model=model, max_tokens=4)
    try:
        text = await policy.act(MESSAGES)
    finally:
        await policy.aclose()
    assert isinstance(text, str) and text


@pytest.mark.timeout(180)
async def test_server_refusal_raises_with_status_and_body(served_model: tuple[str, str]) -> None:
    base_url, _ = served_model
    async with OpenAIChatPolicy(base_url, "no-such-model", max_tokens=4, timeout=30) as policy:
        with pytest.raises(InferenceServerError) as info:
            await policy.act(MESSAGES)
    assert info.value.status_code == 400
    assert "no-such-model" in info.value.body
    assert "HTTP 400" in str(info.value)


@pytest.mark.timeout(20)
async def test_unreachable_server_raises_a_connection_error() -> None:
    port = free_port()  # nothing listens there
    async with OpenAIChatPolicy(f"http://127.0.0.1:{port}", "m", timeout=5) as policy:
        with pytest.raises(InferenceConnectionError, match="is the server running"):
            await policy.act(MESSAGES)


def test_chat_completions_url_accepts_base_urls_with_or_without_v1() -> None:
    expected = "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1") == expected
    assert chat_completions_url("http://h:1/") == expected
    assert chat_completions_url("http://h:1/v1") == expected
    assert chat_completions_url("http://h:1/v1/") == expected


def test_request_body_carries_sampling_settings_and_extra_body_last() -> None:
    policy = OpenAIChatPolicy(
        "http://h:1", "m", temperature=0.5, top_p=0.9, max_tokens=7, seed=3,
        extra_body={"top_k": 20, "temperature": 0.1},
    )
    body = policy.request_body(MESSAGES)
    assert body == {
        "model": "m", "messages": MESSAGES, "temperature": 0.1, "top_p": 0.9,
        "max_tokens": 7, "seed": 3, "top_k": 20,
    }


def _counting_app(delay_s: float, body: str | None = None):  # type: ignore[no-untyped-def]
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI()
    app.state.in_flight = 0
    app.state.peak = 0

    @app.post("/v1/chat/completions")
    async def complete() -> object:
        app.state.in_flight += 1
        app.state.peak = max(app.state.peak, app.state.in_flight)
        await asyncio.sleep(delay_s)
        app.state.in_flight -= 1
        if body is not None:
            return PlainTextResponse(body)
        return {"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}

    return app


@pytest.mark.timeout(30)
async def test_concurrency_bounds_requests_in_flight() -> None:
    app = _counting_app(delay_s=0.1)
    with running_server(app) as base_url:
        async with OpenAIChatPolicy(base_url, "m", concurrency=2, timeout=10) as policy:
            replies = await asyncio.gather(*(policy.act(MESSAGES) for _ in range(6)))
    assert replies == ["ok"] * 6
    assert app.state.peak == 2


@pytest.mark.timeout(30)
async def test_a_200_body_that_is_not_a_completion_raises_a_response_error() -> None:
    with running_server(_counting_app(delay_s=0.0, body='{"choices": []}')) as base_url:
        async with OpenAIChatPolicy(base_url, "m", timeout=10) as policy:
            with pytest.raises(InferenceResponseError, match="not a chat completion"):
                await policy.act(MESSAGES)


@pytest.mark.timeout(240)
def test_rollout_preflight_names_the_served_models_then_runs_with_the_right_one(
    served_model: tuple[str, str], tmp_path: Path
) -> None:
    from tests.cli.conftest import assert_one_line_error, envsdk

    base_url, model = served_model
    args = ["rollout", "--env", "frozen_lake", "--policy", "openai", "--api-base", f"{base_url}/v1",
            "--episodes", "1", "--max-turns", "1", "--no-progress"]
    wrong = envsdk(*args, "--model", "no-such-model", cwd=tmp_path)
    assert_one_line_error(wrong, "does not serve the model 'no-such-model'", model)
    right = envsdk(*args, "--model", model, cwd=tmp_path, timeout=200)
    assert right.returncode == 0, right.stderr


# ---------------------------------------------------------------- bounds in seconds and bytes

_COMPLETION = b'{"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}'


def _trickling_app(body: bytes, delay_s: float, chunk: int, declared_length: bool = False):  # type: ignore[no-untyped-def]
    """A server that sends `body` `chunk` bytes at a time, `delay_s` apart: each read gets bytes
    well within any per-read timeout while the whole answer takes long (or is huge)."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    app.state.sent = 0

    @app.post("/v1/chat/completions")
    async def complete() -> StreamingResponse:
        async def pieces():  # type: ignore[no-untyped-def]
            for start in range(0, len(body), chunk):
                app.state.sent += len(body[start : start + chunk])
                yield body[start : start + chunk]
                await asyncio.sleep(delay_s)

        headers = {"content-length": str(len(body))} if declared_length else None
        return StreamingResponse(pieces(), media_type="application/json", headers=headers)

    return app


@pytest.mark.timeout(60)
async def test_a_trickling_server_is_cut_off_at_the_total_deadline() -> None:
    # One byte every 0.25 s: a 2 s per-read timeout never fires; the whole body takes ~23 s.
    app = _trickling_app(_COMPLETION, delay_s=0.25, chunk=1)
    with running_server(app, timeout_graceful_shutdown=2) as base_url:
        async with OpenAIChatPolicy(base_url, "m", timeout=2) as policy:
            started = time.monotonic()
            with pytest.raises(InferenceTimeoutError, match=r"within 2(\.0)? s") as caught:
                await policy.act(MESSAGES)
            elapsed = time.monotonic() - started
    assert isinstance(caught.value, InferenceConnectionError)  # still an unreachable-server error
    assert elapsed < 2 + 3, f"took {elapsed:.1f} s with timeout=2"


@pytest.mark.timeout(60)
async def test_a_body_over_the_limit_is_refused_before_it_is_read_whole() -> None:
    big = b'{"choices": [{"message": {"content": "' + b"x" * (8 << 20) + b'"}}]}'
    app = _trickling_app(big, delay_s=0.01, chunk=64 << 10)
    with running_server(app, timeout_graceful_shutdown=2) as base_url:
        async with OpenAIChatPolicy(base_url, "m", timeout=30, max_response_bytes=1 << 20) as policy:
            with pytest.raises(InferenceResponseTooLargeError, match="max_response_bytes") as caught:
                await policy.act(MESSAGES)
    assert isinstance(caught.value, InferenceResponseError)
    assert caught.value.limit == 1 << 20
    # The policy stopped reading soon after the limit (the server may have buffered a little more).
    assert app.state.sent < len(big) // 2


@pytest.mark.timeout(60)
async def test_a_declared_length_over_the_limit_is_refused_without_reading() -> None:
    big = b'{"choices": [{"message": {"content": "' + b"x" * (4 << 20) + b'"}}]}'
    app = _trickling_app(big, delay_s=0.05, chunk=64 << 10, declared_length=True)
    with running_server(app, timeout_graceful_shutdown=2) as base_url:
        async with OpenAIChatPolicy(base_url, "m", timeout=30, max_response_bytes=1 << 20) as policy:
            with pytest.raises(InferenceResponseTooLargeError, match="declares"):
                await policy.act(MESSAGES)


@pytest.mark.timeout(30)
async def test_a_body_within_the_limit_is_read() -> None:
    app = _trickling_app(_COMPLETION, delay_s=0.0, chunk=16)
    with running_server(app) as base_url:
        async with OpenAIChatPolicy(base_url, "m", timeout=10, max_response_bytes=len(_COMPLETION)) as policy:
            assert await policy.act(MESSAGES) == "ok"


# ---------------------------------------------------------------- OpenAI conventions


def _recording_app():  # type: ignore[no-untyped-def]
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[tuple[str | None, Any]] = []

    async def complete(request: Request) -> JSONResponse:
        seen.append((request.headers.get("authorization"), await request.json()))
        return JSONResponse({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})

    app = Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])
    app.state.seen = seen
    return app


@pytest.mark.timeout(30)
async def test_api_key_defaults_to_the_openai_api_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _recording_app()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    with running_server(app) as base_url:
        async with OpenAIChatPolicy(base_url, "m", temperature=0.0, top_p=0.5, max_tokens=9) as policy:
            await policy.act(MESSAGES)
        async with OpenAIChatPolicy(base_url, "m", api_key="sk-given") as policy:
            await policy.act(MESSAGES)
        async with OpenAIChatPolicy(base_url, "m", api_key="") as policy:
            await policy.act(MESSAGES)
    (auth_env, body), (auth_given, _), (auth_none, _) = app.state.seen
    assert auth_env == "Bearer sk-from-env"
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.0, 0.5, 9)
    assert auth_given == "Bearer sk-given"
    assert auth_none is None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"timeout": 0}, "timeout"),
        ({"max_response_bytes": 0}, "max_response_bytes"),
    ],
)
def test_out_of_range_sampling_options_are_refused_naming_the_option(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        OpenAIChatPolicy("http://h:1", "m", **kwargs)
