"""Apps served by `bench.core`'s server processes (``envsdk serve bench.core_apps:<name>``);
only those children import this module."""

from __future__ import annotations

from envsdk.server import create_app
from envsdk.testing import EchoAction, EchoEnvironment, EchoObservation

HUNG_STEP_DEADLINE_S = 1.0
BIG_OBSERVATION_BYTES = 8 * 1024 * 1024


class BigObservationEnvironment(EchoEnvironment):
    """Echo env whose every step observation carries `BIG_OBSERVATION_BYTES` of text."""

    def step(self, action: EchoAction) -> EchoObservation:
        obs = super().step(action)
        obs.echoed_message = "x" * BIG_OBSERVATION_BYTES
        return obs


hung = create_app(
    EchoEnvironment, EchoAction, EchoObservation, web=False, max_concurrent_envs=512,
    step_timeout_s=HUNG_STEP_DEADLINE_S,
)
"""The echo env (a plain sync env: the default path) with a 1 s step deadline."""

big = create_app(BigObservationEnvironment, EchoAction, EchoObservation, web=False, max_concurrent_envs=64)
"""8 MiB observations, default replay record bounds."""
