"""``envsdk report a.jsonl b.jsonl``: ``compare.png`` keeps every text apart (titles, the labels
under and above its bars), also for files of hundreds of episodes, whose counts ran the titles
past their plots into each other, and for long file labels."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.cli.conftest import envsdk

pytestmark = pytest.mark.timeout(300)


def _texts(fig: object) -> list[tuple[str, object]]:
    """Every text drawn on the figure with its box: titles, tick labels, bar labels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # type: ignore[arg-type]
    canvas.draw()
    renderer = canvas.get_renderer()
    found: list[tuple[str, object]] = []
    for ax in fig.axes:  # type: ignore[attr-defined]
        found.append((f"title {ax.get_title()!r}", ax.title.get_window_extent(renderer)))
        labels = [*ax.get_xticklabels(), *ax.get_yticklabels(), *ax.texts]
        found += [(repr(t.get_text()), t.get_window_extent(renderer)) for t in labels if t.get_text() and t.get_visible()]
    return found


@pytest.mark.parametrize("names", [("before", "after"), ("a-rather-long-run-name", "another-long-run-name")])
def test_compare_png_keeps_its_titles_and_labels_apart(tmp_path: Path, names: tuple[str, str]) -> None:
    from envsdk.report import _labels, comparison_figure, load_episodes

    files = []
    for name, policy in zip(names, ("random", "oracle"), strict=True):
        (tmp_path / name).mkdir()
        played = envsdk("rollout", "--env", "frozen_lake", "--policy", policy, "--episodes", "160", "--no-progress",
                        "--out", f"{name}/completions.jsonl", cwd=tmp_path)
        assert played.returncode == 0, played.stderr
        files.append(tmp_path / name / "completions.jsonl")
    reported = envsdk("report", *(f"{n}/completions.jsonl" for n in names), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    assert (tmp_path / "comparison_report" / "compare.png").read_bytes().startswith(b"\x89PNG")

    # The figure the command drew, from the same files, measured.
    figure = comparison_figure(list(zip(_labels(files), [load_episodes(f) for f in files], strict=True)))
    texts = _texts(figure)
    clashes = [(a, b) for (a, box), (b, other) in itertools.combinations(texts, 2) if box.overlaps(other)]  # type: ignore[attr-defined]
    assert not clashes, clashes
    assert any("160/160 stated" in name for name, _ in texts)  # each file's counts, under its bar
