"""Code execution in sandboxes behind an envsdk server, on OpenEnv's coding env wire.

``create_coding_app()`` builds the app; ``python -m servers.coding`` (or
``start_coding_server.py``) serves it. See README.md.
"""

from servers.coding.app import create_coding_app
from servers.coding.environment import CodingEnvironment, CodingOptionError
from servers.coding.models import CodeAction, CodeObservation, CodeState
from envsdk.games.humaneval import Problem, TaskSetError, humaneval

__all__ = [
    "create_coding_app",
    "CodingEnvironment",
    "CodingOptionError",
    "CodeAction",
    "CodeObservation",
    "CodeState",
    "Problem",
    "TaskSetError",
    "humaneval",
]
