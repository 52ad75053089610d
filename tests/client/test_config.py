"""Value objects, URL handling and the error-frame mapping: pure functions, no sockets."""

from __future__ import annotations

import pytest

import envsdk.client as client_pkg
from envsdk.client import Keepalive, Retry, Timeouts, error_from_frame, websocket_url
from envsdk.errors import (
    AuthenticationError,
    CapacityError,
    EnvTimeoutError,
    EpisodeDoneError,
    NotResetError,
    ServerError,
    SessionLostError,
)
from envsdk.protocol import ErrorData


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws"),
        ("https://env.example.org", "wss://env.example.org/ws"),
        ("ws://h:1/", "ws://h:1/ws"),
        ("wss://h/prefix/", "wss://h/prefix/ws"),
        ("http://h:1/prefix/ws", "ws://h:1/prefix/ws"),
        ("http://h:1/p?token=a", "ws://h:1/p/ws?token=a"),
    ],
)
def test_base_urls_map_to_the_ws_endpoint(base: str, expected: str) -> None:
    assert websocket_url(base) == expected


@pytest.mark.parametrize("bad", ["ftp://h/", "127.0.0.1:8000", "http://", ""])
def test_unusable_base_url_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="base_url"):
        websocket_url(bad)


def test_keepalive_can_be_disabled_two_ways() -> None:
    assert not Keepalive(None).enabled
    assert Keepalive.disabled() == Keepalive(interval=None, timeout=None)
    assert Keepalive().enabled


def test_retry_backoff_doubles_up_to_its_maximum() -> None:
    retry = Retry(max_attempts=5, backoff_base=0.5, backoff_max=3.0)
    assert [retry.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


@pytest.mark.parametrize("bad", [{"connect": 0}, {"request": -1.0}, {"close": 0.0}])
def test_nonpositive_timeouts_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Timeouts(**bad)


def test_negative_retry_attempts_are_refused() -> None:
    with pytest.raises(ValueError):
        Retry(max_attempts=-1)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        ("CAPACITY_REACHED", CapacityError),
        ("TIMEOUT", EnvTimeoutError),
        ("EPISODE_DONE", EpisodeDoneError),
        ("NOT_RESET", NotResetError),
        ("UNAUTHORIZED", AuthenticationError),
        ("EXECUTION_ERROR", ServerError),
        ("SOMETHING_NEW", ServerError),
    ],
)
def test_error_frames_map_to_typed_errors_keeping_every_detail(code: str, cls: type[ServerError]) -> None:
    error = error_from_frame(ErrorData(message="m", code=code, active_sessions=3, max_sessions=3, extra=[1]))
    assert type(error) is cls
    assert isinstance(error, ServerError)
    assert (error.message, error.code) == ("m", code)
    assert error.details == {"active_sessions": 3, "max_sessions": 3, "extra": [1]}


def test_capacity_error_exposes_active_and_max_sessions() -> None:
    error = error_from_frame(ErrorData(message="full", code="CAPACITY_REACHED", active_sessions=2, max_sessions=2))
    assert isinstance(error, CapacityError)
    assert (error.active_sessions, error.max_sessions) == (2, 2)


def test_resume_failed_is_a_lost_session_with_its_details() -> None:
    error = error_from_frame(ErrorData(message="expired", code="RESUME_FAILED", session_id="s1"))
    assert isinstance(error, SessionLostError)
    assert (error.code, error.session_id, error.details) == ("RESUME_FAILED", "s1", {"session_id": "s1"})


def test_public_api_is_exported() -> None:
    for name in client_pkg.__all__:
        assert getattr(client_pkg, name) is not None
    import envsdk

    assert envsdk.EnvClient is client_pkg.EnvClient
    assert envsdk.OpenEnvWrapper is client_pkg.OpenEnvWrapper
