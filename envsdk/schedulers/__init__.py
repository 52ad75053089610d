"""Multi-turn schedulers: drive policy ↔ environment conversations and record trajectories.

`MultiTurnScheduler` is the hook protocol (ms-swift's, plus ``on_trajectory_end`` always
called); `GYMScheduler` runs local `Env`s, `OpenEnvScheduler` remote OpenEnv-compatible
servers, `SudokuScheduler` TextArena Sudoku with shaped rewards and hints, `ToolScheduler` any
tool environment through the model's tool calls. Importing this package registers them in
`envsdk.registry.schedulers` as ``gym``, ``openenv``, ``sudoku`` and ``tools``.
"""

from __future__ import annotations

from envsdk.registry import schedulers as _registry
from envsdk.schedulers.base import (
    CUT_RULES,
    CutRule,
    MultiTurnScheduler,
    Policy,
    Status,
    StepRecord,
    Trajectory,
    TrajectoryWriter,
    TurnResult,
    completion_of,
)
from envsdk.schedulers.gym import GYMScheduler
from envsdk.schedulers.openenv import DEFAULT_BASE_URL, EnvSession, OpenEnvScheduler
from envsdk.schedulers.tools import ToolScheduler, parse_tool_call, scheduler_for, serves_tools
from envsdk.schedulers.sudoku import (
    SUDOKU_SYSTEM_MESSAGE,
    SudokuEpisode,
    SudokuHints,
    SudokuReward,
    SudokuScheduler,
    move_components,
    sudoku_hints,
)

__all__ = [
    "CUT_RULES",
    "CutRule",
    "MultiTurnScheduler",
    "Policy",
    "Status",
    "StepRecord",
    "Trajectory",
    "TrajectoryWriter",
    "TurnResult",
    "completion_of",
    "GYMScheduler",
    "OpenEnvScheduler",
    "EnvSession",
    "DEFAULT_BASE_URL",
    "SudokuScheduler",
    "ToolScheduler",
    "parse_tool_call",
    "scheduler_for",
    "serves_tools",
    "SudokuEpisode",
    "SudokuHints",
    "SudokuReward",
    "SUDOKU_SYSTEM_MESSAGE",
    "move_components",
    "sudoku_hints",
]

for _name, _cls in (
    ("gym", GYMScheduler), ("openenv", OpenEnvScheduler), ("sudoku", SudokuScheduler), ("tools", ToolScheduler),
):
    if _name not in _registry:
        _registry[_name] = _cls
