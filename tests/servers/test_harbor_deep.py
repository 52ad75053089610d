"""What the agent changed is measured before the engine is asked for its list (no container).

podman's list of a container's changes (``podman diff``) costs about 30 µs an entry plus 5 µs
a folder level of each, far more for one long chain of folders (1,900 nested folders: a
minute), while it holds the store's lock that every container start on the machine waits
for. So the tamper check first walks the container's upper layer on the host within a
`ChangeBudget`; past it the tests are not run (0.0, said in one line), and the engine is
never asked. A check that runs out of time because of the agent's files scores 0.0 too;
an engine that fails on its own stays an error.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envsdk.sandbox.container import ContainerError, ContainerLimits
from servers.harbor import tamper
from servers.harbor.tamper import (
    TOO_MANY_CHANGES,
    ChangeBudget,
    ImageLinks,
    measure_changes,
)


@pytest.fixture
def nest(tmp_path: Path) -> Iterator[Callable[[Path, int], None]]:
    """Makes `depth` folders one in another under a folder (one-letter names) with one ``mkdir
    -p``, as the agent did; removes them with ``rm -rf`` (Python's own walk recurses too deep)."""
    made: list[Path] = []

    def make(root: Path, depth: int) -> None:
        made.append(root)
        subprocess.run(["mkdir", "-p", "--", str(root.joinpath(*["a"] * depth))], check=True)

    yield make
    for root in made:
        subprocess.run(["rm", "-rf", "--", str(root)], check=True)


def test_changes_within_the_budget_pass(tmp_path: Path, nest: Callable[[Path, int], None]) -> None:
    (tmp_path / "app").mkdir()
    for index in range(100):
        (tmp_path / "app" / f"f{index}").write_text("x")
    nest(tmp_path / "deep", 120)
    (tmp_path / "app" / "link").symlink_to("/tests/expected.json")  # a link is one entry, never followed
    assert measure_changes(str(tmp_path), ChangeBudget()) is None


def test_folders_nested_too_deep_are_named_at_once(tmp_path: Path, nest: Callable[[Path, int], None]) -> None:
    # walker4's H3: one `mkdir -p` of 1,900 nested folders.
    nest(tmp_path / "root", 1900)
    started = time.monotonic()
    assert measure_changes(str(tmp_path), ChangeBudget()) == "/root/a (folders nested more than 128 deep: too deep to check)"
    assert time.monotonic() - started < 5
    assert measure_changes(str(tmp_path), ChangeBudget(depth=2000, path_bytes=8192)) == TOO_MANY_CHANGES  # 1.8 million levels
    assert measure_changes(str(tmp_path), ChangeBudget(depth=2000, levels=2_000_000, path_bytes=8192)) is None


@pytest.mark.parametrize("budget", [ChangeBudget(entries=99), ChangeBudget(levels=150), ChangeBudget(seconds=0.0)])
def test_too_many_entries_levels_or_seconds_are_too_many_changes(tmp_path: Path, budget: ChangeBudget) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for index in range(5000 if budget.seconds == 0 else 100):
        (folder / f"f{index}").touch()
    assert measure_changes(str(tmp_path), budget) == TOO_MANY_CHANGES


def test_paths_longer_than_the_engines_list_may_be_are_too_many_changes(tmp_path: Path) -> None:
    long = tmp_path / ("n" * 200)
    long.mkdir()
    for index in range(20):
        (long / f"{'x' * 200}{index}").touch()
    assert measure_changes(str(tmp_path), ChangeBudget(), max_bytes=1 << 20) is None
    assert measure_changes(str(tmp_path), ChangeBudget(), max_bytes=4096) == TOO_MANY_CHANGES


def test_a_path_too_long_for_the_engine_is_refused_by_its_length(tmp_path: Path) -> None:
    # 16 folders of 250-byte names: 4 KB, past what the engine can read under its own folder
    # ("file name too long": an episode error, the agent's doing), though only 16 deep.
    folder = tmp_path
    for i in range(16):
        folder = folder / (chr(ord("a") + i) * 250)
        folder.mkdir()
    said = measure_changes(str(tmp_path), ChangeBudget())
    assert said is not None and said.endswith("(a path longer than 3072 bytes: too long to check)"), said
    assert said.startswith("/" + "a" * 250 + "/" + "b" * 250)


def test_a_folder_that_cannot_be_read_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        measure_changes(str(tmp_path / "gone"), ChangeBudget())


# ---------------------------------------------------------------- the check's own deadline


class _Engine:
    kind = "podman"

    def call(self, args: list[str], *, timeout: float, check: bool = True, **_: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(args, 0, b"", b"")


class _Sandbox:
    """Just what `tamper.check` asks of a container until the engine's list; that list is `slow`
    (it runs past the deadline, then fails as the engine's call does) or `broken` (fails at once)."""

    image = "example:latest"
    id = "c0ffee"
    limits = ContainerLimits()

    def __init__(self, how: str) -> None:
        self.engine = _Engine()
        self.how = how

    def changes(self, *, timeout: float, **_: Any) -> list[tuple[str, str]]:
        if self.how == "slow":
            time.sleep(timeout)
            raise ContainerError(f"podman diff did not finish in {timeout:g} s")
        raise ContainerError("podman diff: no such container")


@pytest.fixture
def image_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tamper._image_links, _Sandbox.image, ImageLinks())
    monkeypatch.setitem(tamper._image_env, _Sandbox.image, {})


@pytest.mark.usefixtures("image_known")
def test_an_engine_list_past_the_deadline_scores_zero_where_nothing_measured_the_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No folder of the host to measure (vfs, a remote Docker daemon): the list's time is the agent's files.
    monkeypatch.setattr(tamper, "_upper_folder", lambda sandbox, timeout_s: None)
    assert tamper.check(_Sandbox("slow"), {}, timeout_s=0.2) == [TOO_MANY_CHANGES]  # type: ignore[arg-type]
    with pytest.raises(ContainerError, match="no such container"):
        tamper.check(_Sandbox("broken"), {}, timeout_s=0.2)  # type: ignore[arg-type]


@pytest.mark.usefixtures("image_known")
def test_an_engine_list_past_the_deadline_is_an_error_once_the_changes_were_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # Measured within the budget: the engine's list takes seconds at most, so a deadline
    # passed is the engine's (or the machine's), not the agent's.
    monkeypatch.setattr(tamper, "_upper_folder", lambda sandbox, timeout_s: str(tmp_path))
    with pytest.raises(ContainerError, match="did not finish"):
        tamper.check(_Sandbox("slow"), {}, timeout_s=0.2)  # type: ignore[arg-type]
