"""Harbor task folders served in containers behind an envsdk server, on OpenEnv's wire and MCP.

``create_harbor_app(tasks)`` builds the app (``harbor_environment_factory(tasks)`` its
environments, without a server); ``python -m servers.harbor --tasks DIR`` (or
``start_harbor_server.py``) serves it. `load_tasks` / `read_task` read task folders without
a container. See README.md.
"""

from servers.harbor.app import create_harbor_app, harbor_environment_factory
from servers.harbor.environment import (
    HarborEnvironment,
    HarborLimits,
    HarborOptionError,
    HarborTasks,
    Verdict,
    parse_reward,
    verify,
)
from servers.harbor.models import HarborAction, HarborObservation, HarborState
from servers.harbor.tasks import (
    HarborTask,
    TaskError,
    TaskFolderError,
    load_tasks,
    read_task,
    scan_tasks,
)

__all__ = [
    "HarborAction",
    "HarborEnvironment",
    "HarborLimits",
    "HarborObservation",
    "HarborOptionError",
    "HarborState",
    "HarborTask",
    "HarborTasks",
    "TaskError",
    "TaskFolderError",
    "Verdict",
    "create_harbor_app",
    "harbor_environment_factory",
    "load_tasks",
    "parse_reward",
    "read_task",
    "scan_tasks",
    "verify",
]
