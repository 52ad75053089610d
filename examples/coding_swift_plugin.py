"""ms-swift plugin: envsdk's `CodingScheduler` as an ms-swift multi-turn scheduler.

Load it with ``--external_plugins examples/coding_swift_plugin.py`` (``swift rollout`` and
``swift rlhf``, in the ms-swift environment ``scripts/test_swift.sh`` builds); it registers
``envsdk_coding`` in ms-swift's ``swift.rollout.multi_turns``::

    python -m servers.coding --port 8000 &
    swift rollout ... --external_plugins examples/coding_swift_plugin.py \\
        --multi_turn_scheduler envsdk_coding --use_gym_env true --max_turns 4

Each reply's last fenced code block runs in the session's sandbox; the episode's
``total_reward`` (1.0 once the problem's tests pass) is ms-swift's ``gym_reward`` column under
``use_gym_env``. Rows' ``env_config``: ``seed`` (problem ``seed % 164``) or ``reset_kwargs``
``{"task_id": "HumanEval/7"}``, ``base_url`` (else ``$ENVSDK_BASE_URL``, else
``http://localhost:8000``). The session handling (one per row, closed on every end, envsdk's
background loop) is the Sudoku plugin's `EnvsdkSchedulerBridge`, loaded from
``examples/swift/sudoku_scheduler.py`` the way ms-swift loads plugins. For tool-calling
models, the Sudoku plugin's ``envsdk_tools`` plays the same server through its MCP tools
(``run_python``, ``run_tests``, ``submit``).
"""

from __future__ import annotations

import os
from pathlib import Path

from swift.rollout import multi_turns
from swift.utils import import_external_file

from envsdk.schedulers.coding import CodingScheduler

_bridge = import_external_file(str(Path(__file__).resolve().parent / "swift" / "sudoku_scheduler.py"))

__all__ = ["EnvsdkCodingScheduler"]


class EnvsdkCodingScheduler(_bridge.EnvsdkSchedulerBridge):  # type: ignore[name-defined,misc]
    """HumanEval on envsdk's coding server, replies' code blocks as actions."""

    def make_core(self) -> CodingScheduler:
        return CodingScheduler(
            base_url=os.environ.get("ENVSDK_BASE_URL") or None,
            max_concurrent_envs=int(os.environ.get("ENVSDK_MAX_CONCURRENT_ENVS", "4")),
            max_turns=int(self.max_turns or 10**6),
        )


multi_turns["envsdk_coding"] = EnvsdkCodingScheduler
