"""Environments with faults, for the reliability tests. Importable as ``reliability.envs``
by a server subprocess started with ``tests/`` on its PYTHONPATH (see `helpers.serve_process`)."""

from __future__ import annotations

import os
import time
from typing import Any

from envsdk.testing import EchoEnvironment, EchoObservation

CLOSE_LOG_ENV = "ENVSDK_TEST_CLOSE_LOG"
HANG_SEED = 13


class CloseLoggingEnvironment(EchoEnvironment):
    """The echo env (``sleep:<s>`` steps included) that appends one line to the file named by
    ``$ENVSDK_TEST_CLOSE_LOG`` each time an instance is closed: a subprocess server's closes
    become visible to the test."""

    def close(self) -> None:
        with open(os.environ[CLOSE_LOG_ENV], "a", encoding="utf-8") as log:
            log.write(f"closed {self.state.episode_id}\n")


class HangingResetEnvironment(EchoEnvironment):
    """``reset(seed=13)`` blocks its worker thread for 3 s; any other seed resets at once."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> EchoObservation:
        if seed == HANG_SEED:
            time.sleep(3.0)
        return super().reset(seed=seed, episode_id=episode_id, **kwargs)


class RaisingCloseEnvironment(EchoEnvironment):
    """An echo env whose ``close`` raises."""

    closes = 0

    def close(self) -> None:
        type(self).closes += 1
        raise RuntimeError("close failed on purpose")
