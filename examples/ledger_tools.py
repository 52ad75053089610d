"""A small tool environment: a ledger whose balance must be brought to a target with tools.

Pure Python, no model needed to play it. Serve it (``python examples/ledger_tools.py --port
8000``) and any MCP client sees three tools, ``deposit``, ``withdraw`` and ``balance``; OpenEnv's
``MCPToolClient`` works unchanged, and TRL trains on it through
`envsdk.integrations.trl.tool_environment_factory`. The episode's reward and success are in the
state (``reward``: 1.0 once the balance equals the target, else 0.0; ``success``: whether it does).
"""

from __future__ import annotations

import argparse
import random
import uuid

from pydantic import Field

from envsdk.env import Environment
from envsdk.tools import tool
from envsdk.types import Action, Observation, State

__all__ = ["LedgerAction", "LedgerObservation", "LedgerState", "LedgerEnvironment", "MAX_AMOUNT"]

MAX_AMOUNT = 1000


class LedgerAction(Action):
    """A plain step: a note in the ledger (the tools do the work)."""

    note: str = ""


class LedgerObservation(Observation):
    prompt: str = ""
    balance: int = 0
    target: int = 0


class LedgerState(State):
    balance: int = 0
    target: int = 0
    reward: float = Field(default=0.0, description="1.0 once the balance equals the target")
    success: bool = Field(default=False, description="whether the balance equals the target")
    notes: list[str] = Field(default_factory=list)


class LedgerEnvironment(Environment[LedgerAction, LedgerObservation, LedgerState]):
    """A ledger: reach the target balance with deposit and withdraw."""

    INLINE_SYNC = True  # every call is a few integer operations

    def __init__(self) -> None:
        self._state = LedgerState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: object) -> LedgerObservation:
        rng = random.Random(seed)
        start, target = rng.randint(0, 20) * 5, rng.randint(0, 20) * 5
        self._state = LedgerState(
            episode_id=episode_id or uuid.uuid4().hex, balance=start, target=target, reward=float(start == target),
            success=start == target,
        )
        prompt = (
            f"The ledger holds {start}. Bring it to exactly {target} with the deposit and withdraw tools."
        )
        return LedgerObservation(prompt=prompt, balance=start, target=target)

    def step(self, action: LedgerAction) -> LedgerObservation:
        self._state.step_count += 1
        self._state.notes.append(action.note)
        return self._observe()

    @property
    def state(self) -> LedgerState:
        return self._state

    @tool
    def deposit(self, amount: int) -> int:
        """Add money to the ledger.

        Args:
            amount: How much to add, from 1 to 1000.

        Returns:
            The new balance.
        """
        return self._move(amount, +1)

    @tool
    def withdraw(self, amount: int) -> int:
        """Take money out of the ledger; the balance may not go below zero.

        Args:
            amount: How much to take out, from 1 to 1000.

        Returns:
            The new balance.
        """
        return self._move(amount, -1)

    @tool
    def balance(self) -> int:
        """Read the balance.

        Returns:
            The current balance.
        """
        return self._state.balance

    def _move(self, amount: int, sign: int) -> int:
        if not 1 <= amount <= MAX_AMOUNT:
            raise ValueError(f"amount must be between 1 and {MAX_AMOUNT}, got {amount}")
        state = self._state
        if sign < 0 and amount > state.balance:
            raise ValueError(f"cannot withdraw {amount}: the balance is {state.balance}")
        state.step_count += 1
        state.balance += sign * amount
        state.success = state.balance == state.target
        state.reward = float(state.success)
        return state.balance

    def _observe(self) -> LedgerObservation:
        state = self._state
        return LedgerObservation(
            prompt=f"Balance {state.balance}, target {state.target}.",
            balance=state.balance,
            target=state.target,
            reward=state.reward,
        )


def create_ledger_app(**config: object) -> object:
    """The ledger served by envsdk (`ServerConfig` fields as keyword arguments)."""
    from envsdk.server import create_app

    return create_app(LedgerEnvironment, LedgerAction, LedgerObservation, state_type=LedgerState, **config)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    cli = parser.parse_args()
    from envsdk.cli import missing_extra
    from envsdk.server import serve

    try:
        ledger = create_ledger_app()
    except ImportError as exc:  # the [mcp] extra is not installed: say which command installs it
        raise SystemExit(f"ledger_tools: error: {missing_extra(exc) or exc}") from None
    serve(ledger, host=cli.host, port=cli.port)
