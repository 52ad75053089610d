"""Apps built at import time, for ``envsdk serve reliability.apps:<name>`` in a subprocess
(only the child imports this module)."""

from __future__ import annotations

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

from .envs import CloseLoggingEnvironment

short_drain = create_app(CloseLoggingEnvironment, EchoAction, EchoObservation, drain_timeout_s=0.3)
"""Close-logging echo server whose shutdown drain gives up after 0.3 s."""

small_frames = create_app(EchoEnvironment, EchoAction, EchoObservation, max_frame_bytes=64 * 1024)
"""Echo server answering frames over 64 KiB with FRAME_TOO_LARGE."""
