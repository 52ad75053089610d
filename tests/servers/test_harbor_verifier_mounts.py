"""Nothing the agent left, and nothing the tests' programs run, can stand in for the reward.

``/logs`` and ``/tests`` are tmpfs mounts the engine makes with the container, root's, mode
0755: a restart (the verifier's, once the agent is done) gives both fresh and empty, so the
agent's files, modes and ACLs there are gone, and a mount point cannot be renamed, so code the
tests run as ``nobody`` cannot swap either for its own even where ``/`` was left writable to
all. Once ``test.sh`` has returned every process it left is killed before the reward is read,
and the reward file is read only when it is a plain file of at most 64 KiB (never copied whole).

Real podman containers, one per case, of one small task on the Python base image: its tests run
the agent's ``/app/run.sh`` as nobody (uid 65534) and give 1 only when it prints the number kept
in ``/tests/expected.txt``, which the agent never sees. Each attack is an agent that does not do
the task; without the defence each of them scores 1.0.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from envsdk.sandbox.container import ContainerProvider
from servers.harbor import HarborEnvironment, HarborTasks, Verdict, verify
from servers.harbor.tasks import HarborTask, TaskError
from tests._containers import container_engine, container_provider, requires_containers  # noqa: F401 - fixtures
from tests.servers.test_harbor_tamper import LIMITS, TASK_TOML

pytestmark = [requires_containers, pytest.mark.timeout(300)]

# The agent's program runs as nobody first (its output captured), then root compares it with the
# expected number; the reward is written at exit whatever happens.
TEST_SH = """#!/bin/bash
reward=0
trap 'echo "$reward" > /logs/verifier/reward.txt' EXIT
got=$(cd /tmp && timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups \\
    env -i PATH=/usr/local/bin:/usr/bin:/bin bash /app/run.sh 2> /dev/null)
echo "run.sh printed: $got"
if [ "$got" = "$(cat /tests/expected.txt)" ]; then
    reward=1
fi
"""
ANSWER = "42"


def _run_sh(body: str) -> str:
    """The agent's command line that makes /app/run.sh (run by the tests as nobody) do `body`."""
    return f"cat > /app/run.sh <<'EOF'\n#!/bin/bash\n{body}\nEOF\nchmod 755 /app/run.sh"


def _default_acl(uid: int) -> bytes:
    """A POSIX ACL (the kernel's xattr form) giving user `uid` rwx beside the usual owner,
    group and others."""
    undefined = 0xFFFFFFFF
    entries = [(0x01, 7, undefined), (0x02, 7, uid), (0x04, 5, undefined), (0x10, 7, undefined), (0x20, 5, undefined)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, who) for tag, perm, who in entries)


ACL = _default_acl(65534).hex()
# A nobody daemon that, for a few seconds, puts reward 1 in place wherever it can write.
NOBODY_DAEMON = (
    "setsid bash -c 'for i in {1..400}; do echo 1 > /logs/verifier/.r 2> /dev/null && "
    "mv -f /logs/verifier/.r /logs/verifier/reward.txt 2> /dev/null; sleep 0.01; done' "
    "> /dev/null 2>&1 < /dev/null &"
)

# name: (the agent's command line; it never makes run.sh print the answer)
ATTACKS: dict[str, str] = {
    # /logs left writable by all: nobody swaps /logs/verifier for its own, where root's reward.txt
    # cannot be written (a folder of that name) and its reward.json says 1.
    "/logs writable by all": "mkdir -p /logs && chmod 0777 /logs && " + _run_sh(
        "mv /logs/verifier /logs/old && mkdir -p /logs/verifier/reward.txt && "
        "echo '{\"reward\": 1}' > /logs/verifier/reward.json"
    ),
    # / writable by all: nobody renames /logs itself.
    "/ writable by all, /logs renamed": "chmod 0777 / && " + _run_sh(
        "mv /logs /logs.old && mkdir -p /logs/verifier/reward.txt && echo '{\"reward\": 1}' > /logs/verifier/reward.json"
    ),
    # / writable by all: nobody renames /tests and puts its own expected answer there.
    "/ writable by all, /tests renamed": "chmod 0777 / && " + _run_sh(
        "mv /tests /tests.old && mkdir /tests && echo mine > /tests/expected.txt; echo mine"
    ),
    # A default ACL on /logs (its mode unchanged): /logs/verifier and the reward file inherit
    # nobody's rwx, and a nobody daemon rewrites the reward after root wrote it.
    "a default ACL on /logs and a daemon": (
        f"mkdir -p /logs && python3 -c \"import os; os.setxattr('/logs', 'system.posix_acl_default', "
        f"bytes.fromhex('{ACL}'))\" && " + _run_sh(NOBODY_DAEMON)
    ),
    # What the agent plants where the verifier looks, during its own turn.
    "files planted in /logs/verifier and /tests": (
        "mkdir -p /logs/verifier /tests && echo '{\"reward\": 1}' > /logs/verifier/reward.json && "
        "echo 1 > /logs/verifier/reward.txt && echo mine > /tests/expected.txt && chmod 0777 /logs /tests && "
        + _run_sh("echo mine")
    ),
}


@pytest.fixture(scope="module")
def tasks(container_provider: ContainerProvider, tmp_path_factory: pytest.TempPathFactory) -> HarborTasks:  # noqa: F811
    """The answer task, its image built."""
    folder = tmp_path_factory.mktemp("mount-tasks")
    task = folder / "answer"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text(f"Make /app/run.sh print the answer ({ANSWER}).\n")
    (task / "task.toml").write_text(TASK_TOML)
    (task / "environment" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "tests" / "expected.txt").write_text(ANSWER + "\n")
    served = HarborTasks(folder, container_provider, LIMITS)
    assert served.build() == []
    return served


def _with_tests(task: HarborTask, folder: Path, test_sh: str) -> HarborTask:
    """`task` with another tests/ (its test.sh `test_sh`), on the same image."""
    (folder / "tests").mkdir(parents=True)
    (folder / "tests" / "test.sh").write_text(test_sh)
    return replace(task, path=folder)


def _verdict(tasks: HarborTasks, command: str, task: HarborTask | None = None) -> Verdict:
    """The verdict on a container of the answer task (with `task`'s tests) where the agent ran `command`."""
    task = task or tasks.task("answer")
    sandbox = tasks.provider.start(tasks.images["answer"], limits=LIMITS.container_limits(task))
    try:
        ran = sandbox.bash(command, timeout=20)
        assert ran.returncode == 0, ran
        return verify(sandbox, task, timeout_s=30.0)
    finally:
        sandbox.close()


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_agent_that_prepares_logs_or_tests_for_its_code_run_as_nobody_scores_zero(
    tasks: HarborTasks, attack: str,
) -> None:
    verdict = _verdict(tasks, ATTACKS[attack])
    assert verdict.reward == 0.0, verdict


def test_an_honest_agent_that_writes_its_own_logs_under_logs_scores_one(tasks: HarborTasks) -> None:
    # Through the environment, as a server plays it: the agent's own files in /logs are its
    # business and do not disturb the verifier (they are gone once the agent is done).
    env = HarborEnvironment(tasks)
    try:
        env.reset(task="answer")
        said = env.bash(
            "mkdir -p /logs/agent /logs/verifier && echo step > /logs/agent/trajectory.txt && "
            f"echo 0 > /logs/verifier/reward.txt && {_run_sh(f'echo {ANSWER}')} && ls /logs"
        )
        assert "agent" in said, said
        said = env.submit()
    finally:
        env.close()
    assert (env.state.reward, said) == (1.0, "[episode over: submitted; reward 1]")


def test_the_tests_find_fresh_mounts_of_their_own_and_their_files_as_shipped(
    tasks: HarborTasks, tmp_path: Path,
) -> None:
    # What test.sh finds: /logs and /tests are tmpfs mounts, root's 0755, /logs/verifier empty,
    # the tests' files root's with their modes; the agent's /logs is gone.
    look = """#!/bin/bash
{ grep -E ' /(logs|tests) ' /proc/self/mountinfo | cut -d' ' -f5,9; stat -c '%n %U %a' /logs /tests /tests/test.sh \
/tests/tool.sh; ls -A /logs /logs/verifier; /tests/tool.sh; } > /tmp/seen 2>&1
echo 1 > /logs/verifier/reward.txt
"""
    task = _with_tests(tasks.task("answer"), tmp_path / "look", look)
    (task.tests_dir / "tool.sh").write_text("#!/bin/sh\necho tool ran\n")
    (task.tests_dir / "tool.sh").chmod(0o750)
    sandbox = tasks.provider.start(tasks.images["answer"], limits=LIMITS.container_limits(task))
    try:
        assert sandbox.bash("mkdir -p /logs/agent && touch /logs/agent/x /tests/planted").returncode == 0
        verdict = verify(sandbox, task, timeout_s=30.0)
        seen = sandbox.read_file("/tmp/seen").decode()
    finally:
        sandbox.close()
    assert verdict.reward == 1.0, verdict
    lines = seen.splitlines()
    # The two mounts are listed in the order the engine made them, which is not fixed.
    assert sorted(lines[:2]) == ["/logs tmpfs", "/tests tmpfs"], seen
    assert lines[2:] == [
        "/logs root 755", "/tests root 755", "/tests/test.sh root 644",
        "/tests/tool.sh root 750", "/logs:", "verifier", "", "/logs/verifier:", "tool ran",
    ], seen


# ---------------------------------------------------------------- after test.sh

# test.sh gives 0 and leaves a daemon that, once test.sh has ended, keeps putting 1 in place.
DAEMON_TEST_SH = """#!/bin/bash
echo 0 > /logs/verifier/reward.txt
{setup}
{runner} setsid bash -c 'while [ -d /proc/$1 ]; do sleep 0.005; done
    while :; do echo 1 > /logs/verifier/.r && mv -f /logs/verifier/.r /logs/verifier/reward.txt; sleep 0.005; done' \\
    daemon "$$" > /dev/null 2>&1 < /dev/null &
"""


@pytest.mark.parametrize(("setup", "runner"), [
    ("", ""),
    # A careless test that left the folder writable, and a program it runs as nobody.
    ("chmod 0777 /logs/verifier", "setpriv --reuid=65534 --regid=65534 --clear-groups"),
], ids=["root", "nobody"])
def test_a_daemon_the_tests_left_cannot_rewrite_the_reward_after_test_sh(
    tasks: HarborTasks, tmp_path: Path, setup: str, runner: str,
) -> None:
    test_sh = DAEMON_TEST_SH.format(setup=setup, runner=runner)
    task = _with_tests(tasks.task("answer"), tmp_path / "daemon", test_sh)
    verdict = _verdict(tasks, "true", task)
    assert (verdict.reward, verdict.exit_code) == (0.0, 0), verdict


# ---------------------------------------------------------------- the reward file itself


def test_a_huge_sparse_reward_file_is_one_line_and_never_copied(tasks: HarborTasks, tmp_path: Path) -> None:
    task = _with_tests(tasks.task("answer"), tmp_path / "sparse", "#!/bin/bash\ntruncate -s 100M /logs/verifier/reward.txt\n")
    with pytest.raises(TaskError) as caught:
        _verdict(tasks, "true", task)
    said = str(caught.value)
    assert "\n" not in said and "/logs/verifier/reward.txt" in said, said
    assert "104857600 bytes, more than the 65536 read" in said, said


@pytest.mark.parametrize("make", ["mkfifo /logs/verifier/reward.txt", "ln -s /tmp/r /logs/verifier/reward.txt",
                                  "mkdir /logs/verifier/reward.txt"])
def test_a_reward_that_is_no_plain_file_is_not_read(tasks: HarborTasks, tmp_path: Path, make: str) -> None:
    test_sh = f"#!/bin/bash\necho 1 > /tmp/r\n{make}\n"
    task = _with_tests(tasks.task("answer"), tmp_path / "odd", test_sh)
    with pytest.raises(TaskError, match="wrote no reward"):
        _verdict(tasks, "true", task)


def test_the_log_counts_one_tampered_path_in_the_singular(
    tasks: HarborTasks, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="envsdk.harbor"):
        verdict = _verdict(tasks, "echo /opt/nothing.so > /etc/ld.so.preload")
    assert verdict.tampered == ("/etc/ld.so.preload",)
    said = [r.getMessage() for r in caplog.records if "in all)" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("/etc/ld.so.preload (1 path in all)"), said
