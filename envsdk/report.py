"""``envsdk report completions.jsonl``: plots of a file of trajectories, and an HTML page of them.

Reads ``envsdk.completions/1`` records (`envsdk.records`, one JSON object a line, as
`envsdk rollout --out` writes them) and writes, into an output folder (default:
``<file stem>_report/`` beside the file):

* ``total_reward.png`` — the distribution of the episodes' total reward;
* ``components.png`` — the distribution of each reward component's episode value (the record's
  ``reward_components``; Sudoku: its five parts), the first 24 by name where there are more (the
  page's table lists every one);
* ``episodes.png`` — how episodes ended (status counts, success rate) and turns per episode;
  a success rate is over the episodes whose record states ``success`` (null: nobody stated it),
  "n/a" when none does, as in the rollout summary;
* ``training.png`` — only for files from training (records with a ``global_step`` or ``step``
  number): mean total reward (with min–max band), success rate and mean components per step;
* ``report.html`` — a summary table, the groups of rollouts per example with their pass@k
  (`envsdk.evaluate`; a record without a group is a group of one), and the images above; the
  command prints the pass@k table too (on stderr; stdout lists the files written).

Given several files (``envsdk report before.jsonl after.jsonl``), it writes each file's report
beside it (or into ``<out-dir>/<label>/``) and ``compare.png`` into the output folder (default:
``comparison_report/`` in the files' common folder): success rate and mean total reward of each
file side by side, with their standard errors — a before/after plot. A file's label is its
folder's name when the file is called ``completions.jsonl``, else its stem; files whose labels
collide are labelled by their paths from the files' common folder (``a/x`` and ``b/x``), and a
file given twice is refused. Every file is read and every folder made before anything is
written, and a report that fails removes the folders it made (with what it wrote into them).

Plots are drawn with matplotlib's Agg backend through `matplotlib.figure.Figure` (no pyplot
global state, no display); matplotlib is the ``report`` extra.
"""

from __future__ import annotations

import argparse
import html
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from envsdk._process import print_err, print_out
from envsdk.evaluate import (
    EvalError,
    EvalSummary,
    planned_run,
    summarize_groups,
)
from envsdk.records import (
    RecordError,
    basis_labels,
    check_record,
    finite_number,
    mean_and_std,
    number_text,
    part_basis,
    quantile,
    read_jsonl,
    success_text,
    summary_facts,
)

__all__ = [
    "ReportError",
    "Episode",
    "Report",
    "load_episodes",
    "write_report",
    "write_comparison",
    "episodes_figure",
    "comparison_figure",
    "add_report_parser",
    "report_command",
]

_STEP_KEYS = ("global_step", "step")


class ReportError(ValueError):
    """The input cannot be reported on: missing, empty, or not trajectory records."""


@dataclass(frozen=True)
class Episode:
    """What the report reads of one trajectory record."""

    total_reward: float
    #: None where the record states no success (``null``): neither a success nor a failure.
    success: bool | None
    status: str
    turns: int
    components: dict[str, float] = field(default_factory=dict)
    training_step: float | None = None
    #: How each component's value is made from its step values (`envsdk.records.part_basis`).
    bases: dict[str, tuple[frozenset[str], int]] = field(default_factory=dict)


def _episode(record: Any, where: str) -> Episode:
    try:
        checked = check_record(record, where)
    except RecordError as exc:
        raise ReportError(str(exc)) from None
    components: dict[str, float] = {}
    bases: dict[str, tuple[frozenset[str], int]] = {}
    for name, component in checked["reward_components"].items():
        number = finite_number(component.get("value"))
        if number is not None:
            components[str(name)] = number
            bases[str(name)] = part_basis(number, [finite_number(v) for v in component["steps"]])
    given = checked.get("infos")
    infos: dict[str, Any] = given if isinstance(given, dict) else {}
    step = next(
        (s for s in (finite_number(src.get(k)) for src in (checked, infos) for k in _STEP_KEYS) if s is not None), None
    )
    turns = finite_number(checked.get("turns"))
    return Episode(
        total_reward=float(checked["total_reward"]),
        success=success if isinstance(success := checked.get("success"), bool) else None,
        status=str(checked.get("status", "unknown")),
        turns=int(turns) if turns is not None else 0,
        components=components,
        training_step=step,
        bases=bases,
    )


def _success(episodes: Sequence[Episode]) -> str:
    """The success rate of `episodes` in words (`envsdk.records.success_text`)."""
    stated = [e.success for e in episodes if e.success is not None]
    return success_text(sum(stated), len(stated), len(episodes))


def load_episodes(path: str | Path) -> list[Episode]:
    """Every record of the JSON-lines file `path` (blank lines skipped).

    Raises `ReportError` naming the file and line for a missing file, bad JSON, a record that
    is not a trajectory, or a file with no records.
    """
    return _load(path)


def _load(path: str | Path, facts: list[dict[str, Any]] | None = None) -> list[Episode]:
    """`load_episodes`, one record at a time: with `facts`, the fields of each record that its
    groups' pass@k reads (`envsdk.records.summary_facts`) are added to it, so that one pass over
    the file gives both and no record is held whole."""
    episodes: list[Episode] = []
    for where, record in read_jsonl(path, ReportError):
        episodes.append(_episode(record, where))
        if facts is not None:
            facts.append(summary_facts(record))
    if not episodes:
        raise ReportError(f"{path}: no records")
    return episodes


@dataclass(frozen=True)
class Report:
    """The files a report wrote: the HTML page and its plots by name."""

    html: Path
    plots: dict[str, Path]
    groups: EvalSummary | None = None


# ---------------------------------------------------------------- plots


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _bins(values: Sequence[float]) -> int:
    return max(5, min(30, int(math.sqrt(len(values))) * 2))


#: Past this magnitude a plot's range (its largest value less its smallest, and the margin
#: matplotlib adds to it) can overflow, and no plot is drawn.
_PLOT_LIMIT = 1e300


def _unit(values: Iterable[float]) -> tuple[float, str]:
    """What to divide `values` by to plot them, and the title's note of it: 1 and nothing, or a
    power of ten when they reach near the largest float (a reward of 1.7e308 and one of -1.7e308)."""
    largest = max(map(abs, values), default=0.0)
    if largest < _PLOT_LIMIT:
        return 1.0, ""
    exponent = math.floor(math.log10(largest))
    return 10.0**exponent, f" (× 1e{exponent})"


def _mean(values: Sequence[float]) -> float:
    """The mean of non-empty `values`, finite however large they are."""
    return mean_and_std(values)[0]


def _histogram(ax: Any, given: Sequence[float], title: str, color: str) -> None:
    mean = _mean(given)
    unit, note = _unit(given)
    values = [v / unit for v in given] if unit != 1.0 else given
    if min(values) == max(values):
        # One value: one bar over it and one tick at it, not matplotlib's fractional spread.
        only = values[0]
        ax.hist(values, bins=[only - 0.5, only + 0.5], color=color, edgecolor="white")
        ax.set_xticks([only])
    else:
        ax.hist(values, bins=_bins(values), color=color, edgecolor="white")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # episode counts
    ax.axvline(mean / unit, color="#1d2330", linestyle="--", linewidth=1)
    ax.set_title(f"{title}{note}\nmean {number_text(mean)}, n={len(values)}", fontsize=10)
    ax.set_ylabel("episodes")
    ax.grid(axis="y", alpha=0.3)


def _plot_total(episodes: list[Episode], out: Path) -> None:
    fig = _figure(6.4, 3.6)
    _histogram(fig.add_subplot(), [e.total_reward for e in episodes], "total reward", "#2f6fde")
    fig.savefig(out)


#: The most components plotted, the first by name: one figure of thousands of histograms takes
#: minutes and gigabytes to lay out. The page's table lists every one.
_PLOTTED_COMPONENTS = 24


def _component_names(episodes: list[Episode]) -> list[str]:
    return sorted({name for e in episodes for name in e.components})


def _plot_components(episodes: list[Episode], names: list[str], out: Path) -> None:
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    fig = _figure(4.0 * columns, 3.0 * rows)
    for index, name in enumerate(names, start=1):
        values = [e.components[name] for e in episodes if name in e.components]
        _histogram(fig.add_subplot(rows, columns, index), values, name, "#12805c")
    fig.savefig(out)


def episodes_figure(episodes: list[Episode]) -> Any:
    """How episodes ended (status counts, success rate in the title) and turns per episode."""
    from matplotlib.ticker import MaxNLocator

    fig = _figure(10.0, 3.6)
    status_ax, turns_ax = fig.subplots(1, 2)
    statuses = Counter(e.status for e in episodes)
    names = sorted(statuses)
    bars = status_ax.bar(names, [statuses[n] for n in names], color="#8a6fd1")
    status_ax.bar_label(bars)
    status_ax.margins(y=0.12)  # room for the count labels above the bars
    status_ax.set_title(f"how episodes ended — success rate {_success(episodes)}", fontsize=10)
    status_ax.set_ylabel("episodes")
    turns = [e.turns for e in episodes]
    fewest, most = min(turns), max(turns)
    # One bin per whole number of turns while there are few; else bins over the range (the
    # numbers between one record of 2 turns and one of 10^8 are never listed), as floats: a count
    # past 2^63 is no integer numpy plots.
    note = ""
    if most - fewest < 60:
        turns_ax.hist(turns, bins=[t - 0.5 for t in range(fewest, most + 2)], color="#d98b2b", edgecolor="white")
    else:
        unit, note = _unit(turns)
        values = [t / unit for t in turns]
        turns_ax.hist(values, bins=_bins(values), color="#d98b2b", edgecolor="white")
    turns_ax.set_title(f"turns per episode{note} — mean {number_text(_mean(turns), 2)}", fontsize=10)
    turns_ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    turns_ax.set_xlabel("turns")
    turns_ax.set_ylabel("episodes")
    for ax in (status_ax, turns_ax):
        ax.grid(axis="y", alpha=0.3)
    return fig


def training_figure(episodes: list[Episode], names: list[str]) -> Any:
    """The training curves: mean total reward (min–max band), success rate (left out when
    every episode's reward is its 0/1 success: the same curve twice) and mean components, over
    integer training steps."""
    from matplotlib.ticker import MaxNLocator

    by_step: dict[float, list[Episode]] = defaultdict(list)
    for e in episodes:
        if e.training_step is not None:
            by_step[e.training_step].append(e)
    steps = sorted(by_step)
    reward_is_success = all(e.success is not None and e.total_reward == float(e.success) for e in episodes)
    # Success per step only where some episode states it: no curve of unknowns drawn as zeros.
    success_curve = not reward_is_success and any(e.success is not None for e in episodes)
    panels = 1 + (1 if success_curve else 0) + (1 if names else 0)
    fig = _figure(6.4, 2.8 * panels)
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    totals = [[e.total_reward for e in by_step[s]] for s in steps]
    unit, note = _unit(e.total_reward for e in episodes)
    axes[0].plot(steps, [_mean(t) / unit for t in totals], color="#2f6fde", marker="o", markersize=3, label="mean")
    axes[0].fill_between(
        steps, [min(t) / unit for t in totals], [max(t) / unit for t in totals], color="#2f6fde", alpha=0.15, label="min–max"
    )
    axes[0].set_title(
        f"total reward per training step{note}"
        + (" (the reward is success, 0/1: mean = success rate)" if reward_is_success else ""),
        fontsize=10,
    )
    axes[0].legend(fontsize=8)
    if success_curve:
        rated = [(s, sum(stated) / len(stated)) for s in steps if (stated := [float(e.success) for e in by_step[s] if e.success is not None])]
        axes[1].plot([p[0] for p in rated], [p[1] for p in rated], color="#12805c", marker="o", markersize=3)
        axes[1].set_ylim(-0.05, 1.05)
        axes[1].set_title("success rate per training step (episodes that state it)", fontsize=10)
    if names:
        unit, note = _unit(chain.from_iterable(e.components.values() for e in episodes))
        for name in names:
            points = [(s, _mean(vals)) for s in steps if (vals := [e.components[name] for e in by_step[s] if name in e.components])]
            axes[-1].plot([p[0] for p in points], [p[1] / unit for p in points], marker="o", markersize=3, label=name)
        axes[-1].set_title(f"mean components per training step{note}", fontsize=10)
        axes[-1].legend(fontsize=8, ncol=2)
    axes[-1].set_xlabel("training step")
    # Steps are counted, not measured: whole ticks (each step's own while there are few).
    if len(steps) <= 12:
        axes[-1].set_xticks(steps)
    else:
        axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig


def _plot_training(episodes: list[Episode], names: list[str], out: Path) -> None:
    training_figure(episodes, names).savefig(out)


# ---------------------------------------------------------------- page


def _groups_html(groups: EvalSummary) -> str:
    """The pass@k section: overall numbers, then one row per example."""
    ks = groups.ks
    head = "".join(f"<th>pass@{k}</th>" for k in ks)
    # Overall only up to the k every example reaches (`EvalSummary.pass_at`).
    overall = "".join(f"<td>{groups.pass_at[k]:.3f}</td>" if k in groups.pass_at else "<td>-</td>" for k in ks)
    rows = "\n".join(
        f"<tr><td>{html.escape(g.example)}</td><td>{g.n}</td><td>{g.correct}</td><td>{number_text(g.mean_reward)}</td>"
        f"<td>{number_text(g.reward_std)}</td>" + "".join(f"<td>{g.pass_at[k]:.3f}</td>" if k in g.pass_at else "<td>-</td>" for k in ks)
        + "</tr>"
        for g in groups.groups
    )
    return f"""<h2>Groups and pass@k</h2>
<p>{len(groups.groups)} examples · mean reward <b>{number_text(groups.mean_reward)}</b> · zero reward variance in
<b>{groups.zero_variance_share:.1%}</b> of groups · {groups.unstated} record(s) without a stated success</p>
<table>
<thead><tr><th>example</th><th>n</th><th>correct</th><th>mean reward</th><th>std</th>{head}</tr></thead>
<tbody>
<tr><td><b>all</b></td><td></td><td></td><td>{number_text(groups.mean_reward)}</td><td></td>{overall}</tr>
{rows}
</tbody>
</table>"""


def _html(
    source: Path, episodes: list[Episode], names: list[str], plots: dict[str, Path], groups: EvalSummary | None = None
) -> str:
    statuses = ", ".join(f"{k}={v}" for k, v in sorted(Counter(e.status for e in episodes).items()))
    rows = [("total_reward", [e.total_reward for e in episodes])]
    rows += [(n, [e.components[n] for e in episodes if n in e.components]) for n in names]
    rows.append(("turns", [float(e.turns) for e in episodes]))
    # What a component's episode value is (summed over its steps, their mean...), beside it.
    said = basis_labels({n: [e.bases[n] for e in episodes if n in e.bases] for n in names})
    table = "\n".join(
        f"<tr><td>{html.escape(name)}</td><td>{number_text(_mean(v))}</td><td>{number_text(quantile(v, 0.5))}</td>"
        f"<td>{number_text(quantile(v, 0.9))}</td><td>{number_text(min(v))}</td><td>{number_text(max(v))}</td><td>{len(v)}</td>"
        f"<td>{html.escape(said.get(name, ''))}</td></tr>"
        for name, v in rows
    )
    plotted = "" if len(names) <= _PLOTTED_COMPONENTS else (
        f": the first {_PLOTTED_COMPONENTS} by name of {len(names)} components (the table lists them all)"
    )
    captions = {
        "total_reward": "Total reward per episode",
        "components": f"Reward components per episode{plotted}",
        "episodes": "How episodes ended; turns per episode",
        "training": "Curves over training steps",
    }
    figures = "\n".join(
        f'<figure><img src="{html.escape(path.name)}" alt="{html.escape(captions[name])}">'
        f"<figcaption>{html.escape(captions[name])}</figcaption></figure>"
        for name, path in plots.items()
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>envsdk report — {html.escape(source.name)}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; color: #1d2330; margin: 24px auto; max-width: 1100px; padding: 0 16px; }}
table {{ border-collapse: collapse; font-variant-numeric: tabular-nums; }}
td, th {{ padding: 3px 14px 3px 0; border-bottom: 1px solid #e4e7ec; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }}
figure {{ margin: 24px 0; }} img {{ max-width: 100%; border: 1px solid #e4e7ec; }}
figcaption {{ color: #667085; }}
</style>
</head>
<body>
<h1>envsdk report</h1>
<p><code>{html.escape(str(source))}</code></p>
<p>episodes <b>{len(episodes)}</b> · success rate <b>{html.escape(_success(episodes))}</b>
 · statuses {html.escape(statuses)}</p>
<table>
<thead><tr><th></th><th>mean</th><th>p50</th><th>p90</th><th>min</th><th>max</th><th>n</th><th>each episode's value</th></tr></thead>
<tbody>
{table}
</tbody>
</table>
{_groups_html(groups) if groups is not None else ""}
{figures}
</body>
</html>
"""


class _Made:
    """The folders a report run made and the files it wrote into them, so that a run that fails
    (refused or crashed) takes them back: no ``<stem>_report/`` of a failed run is left behind,
    empty or half written. Folders that were there before, and what is in them, are kept."""

    def __init__(self) -> None:
        self.folders: list[Path] = []
        self.files: list[Path] = []

    def folder(self, folder: Path) -> Path:
        """Make `folder` and the folders above it that are missing. `ReportError` names it when
        it cannot be made: a file (or a link to nothing) in its way, or no right to write there."""
        missing: list[Path] = []
        for path in (folder, *folder.parents):
            if path.is_dir():
                break
            if path.exists() or path.is_symlink():
                raise ReportError(
                    f"{folder}: not a folder" if path == folder
                    else f"{folder}: cannot make the report folder: {path} is not a folder"
                )
            missing.append(path)
        for path in reversed(missing):
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir():  # a file made there since the look above
                    raise ReportError(f"{folder}: cannot make the report folder: {path} is not a folder") from None
                continue
            except OSError as exc:
                raise ReportError(f"{folder}: cannot make the report folder ({exc.strerror or exc})") from None
            self.folders.append(path)
        return folder

    def file(self, path: Path) -> Path:
        """`path`, noted as written by this run (taken back on failure if its folder is one made)."""
        self.files.append(path)
        return path

    def take_back(self) -> None:
        """Remove what this run wrote into the folders it made, then those folders, deepest first;
        a folder someone else has put a file into since is kept."""
        made = set(self.folders)
        for path in self.files:
            if path.parent in made:
                path.unlink(missing_ok=True)
        for folder in reversed(self.folders):
            try:
                folder.rmdir()
            except OSError:
                pass


@contextmanager
def _taken_back_on_failure() -> Iterator[_Made]:
    """A `_Made` whose folders and files are taken back when the block raises (anything: a
    refusal, a crash, Ctrl-C); on success they stay."""
    made = _Made()
    try:
        yield made
    except BaseException:
        made.take_back()
        raise


@contextmanager
def _writing(folder: Path) -> Iterator[None]:
    """`ReportError` naming `folder` (and the file) for a file that cannot be written there: a
    read-only or full disk, no right to write, a folder in the way."""
    try:
        yield
    except OSError as exc:
        what = Path(exc.filename).name if isinstance(exc.filename, str) else "the report"
        raise ReportError(f"{folder}: cannot write {what} there ({exc.strerror or exc})") from None


def _read(source: Path) -> tuple[list[Episode], EvalSummary]:
    """The episodes of `source` and its groups' pass@k: everything a report needs from the file,
    read before any folder is made, so that unusable input is refused with nothing written."""
    facts: list[dict[str, Any]] = []
    episodes = _load(source, facts)
    try:
        groups = summarize_groups(facts, planned_run(source))
    except EvalError as exc:
        raise ReportError(str(exc)) from None
    return episodes, groups


def _default_folder(source: Path) -> Path:
    return source.with_name(f"{source.stem}_report")


def _write(source: Path, read: tuple[list[Episode], EvalSummary], folder: Path, made: _Made) -> Report:
    """The plots and page of `source` (read by `_read`) written into `folder` (made by `made`)."""
    episodes, groups = read
    made.folder(folder)
    names = _component_names(episodes)
    plots = {"total_reward": folder / "total_reward.png"}
    with _writing(folder):
        _plot_total(episodes, made.file(plots["total_reward"]))
        if names:
            plots["components"] = folder / "components.png"
            _plot_components(episodes, names[:_PLOTTED_COMPONENTS], made.file(plots["components"]))
        plots["episodes"] = folder / "episodes.png"
        episodes_figure(episodes).savefig(made.file(plots["episodes"]))
        if any(e.training_step is not None for e in episodes):
            plots["training"] = folder / "training.png"
            _plot_training(episodes, names[:_PLOTTED_COMPONENTS], made.file(plots["training"]))
        page = made.file(folder / "report.html")
        page.write_text(_html(source, episodes, names, plots, groups), encoding="utf-8")
    return Report(html=page, plots=plots, groups=groups)


def write_report(path: str | Path, out_dir: str | Path | None = None) -> Report:
    """Write the plots and ``report.html`` for the trajectories in `path` into `out_dir`
    (default: ``<stem>_report/`` beside `path`; created if needed, and removed again, with what
    was written into it, when the report fails). Raises `ReportError` for unreadable input (see
    `load_episodes`) and for an output folder that cannot be made or written into."""
    source = Path(path)
    read = _read(source)
    folder = Path(out_dir) if out_dir is not None else _default_folder(source)
    with _taken_back_on_failure() as made:
        return _write(source, read, folder, made)


# ---------------------------------------------------------------- comparison


def _label(path: Path) -> str:
    label = path.parent.name if path.stem == "completions" and path.parent.name else path.stem
    if label.strip("."):
        return label
    # Not "." or "..", which name no folder of their own under --out-dir but it or the one above
    # it: "..jsonl" is labelled by its whole name, "../completions.jsonl" by the folder's name.
    whole = path.resolve()
    label = whole.parent.name if whole.stem == "completions" and whole.parent.name else whole.stem
    return label if label.strip(".") else whole.name


#: The comparison plot's name in the output folder, beside the labelled report folders: no label.
_COMPARE = "compare.png"


def _labels(files: Sequence[Path]) -> list[str]:
    """Each file's label (`_label`), told apart where two collide: a report folder of
    ``<out-dir>/<label>/`` each, and a bar each in the comparison (one label, one place on its
    axis). A colliding label becomes the file's path from the files' common folder without its
    ``.jsonl`` suffix (or its ``completions.jsonl`` name): ``a/x`` and ``b/x``; should that
    collide too, the whole path from there. Labels that collide with none are kept. Raises
    `ReportError` for a file given twice (one report would replace the other)."""
    seen: dict[Path, Path] = {}
    for file in files:
        resolved = file.resolve()
        if resolved in seen:
            raise ReportError(f"{seen[resolved]}: given twice (also as {file}): one report would replace the other")
        seen[resolved] = file
    common = _common_folder(files)
    choices: list[tuple[str, str, str]] = []
    for file in files:
        path = file.resolve().relative_to(common)
        shorter = path.parent if path.stem == "completions" and len(path.parts) > 1 else path.with_suffix("")
        choices.append((_label(file), shorter.as_posix(), path.as_posix()))
    # How much of its path each label takes: 0 its label, 1 its path less suffix, 2 its path.
    levels = [0] * len(files)
    while True:
        labels = [choice[level] for choice, level in zip(choices, levels, strict=True)]
        counts = Counter(labels)
        colliding = [i for i, label in enumerate(labels) if counts[label] > 1 or label == _COMPARE]
        if not any(levels[i] < 2 for i in colliding):
            break
        for i in colliding:
            levels[i] = min(levels[i] + 1, 2)
    if colliding:  # distinct files whose paths differ only where a label cannot say it
        raise ReportError(f"{files[colliding[0]]}: cannot label its report apart from the others' ({labels[colliding[0]]})")
    return labels


def comparison_figure(labelled: Sequence[tuple[str, list[Episode]]]) -> Any:
    """Success rate and mean total reward of each labelled list of episodes side by side (error
    bars: one standard error). A success rate is over the episodes that state success; a file
    where none does gets no bar and the label "n/a", not a 0% bar."""
    labels = [label for label, _ in labelled]
    # Room under each bar for its label (about 0.085 in a character), in each of the two plots.
    slot = max(0.8, 0.085 * max(map(len, labels)) + 0.3)
    fig = _figure(max(6.4, 1.6 * len(labelled) + 3.0, 2 * len(labelled) * slot + 1.6), 3.6)
    rate_ax, reward_ax = fig.subplots(1, 2)
    rates, rate_errors, rate_labels, stated_counts = [], [], [], []
    means, mean_errors = [], []
    for _, episodes in labelled:
        stated = [e.success for e in episodes if e.success is not None]
        stated_counts.append(len(stated))
        rate = sum(stated) / len(stated) if stated else 0.0
        rates.append(rate)
        rate_errors.append(math.sqrt(rate * (1 - rate) / len(stated)) if stated else 0.0)
        rate_labels.append(f"{rate:.2f}" if stated else "n/a")
        mean, std = mean_and_std([e.total_reward for e in episodes])
        means.append(mean)
        # One standard error: the sample deviation (n - 1) over the square root of n.
        mean_errors.append(std / math.sqrt(max(len(episodes) - 1, 1)))
    colors = ["#8a99b3", "#2f6fde", "#12805c", "#d98b2b", "#8a6fd1"]
    unit, note = _unit(means + mean_errors)
    # Each file's counts under its own bar: in the title they ran past the axes into the other
    # plot's title once the files held hundreds of episodes.
    rate_ticks = [f"{label}\n{k}/{len(e)} stated" for label, k, (_, e) in zip(labels, stated_counts, labelled, strict=True)]
    reward_ticks = [f"{label}\nn = {len(e)}" for label, (_, e) in zip(labels, labelled, strict=True)]
    for ax, values, errors, texts, title, ticks in (
        (rate_ax, rates, rate_errors, rate_labels, "success rate (± 1 s.e.)", rate_ticks),
        (reward_ax, [m / unit for m in means], [e / unit for e in mean_errors], [number_text(v, 2) for v in means],
         f"mean total reward{note} (± 1 s.e.)", reward_ticks),
    ):
        palette = [colors[i % len(colors)] for i in range(len(labels))]
        bars = ax.bar(range(len(labels)), values, yerr=errors, capsize=6, color=palette)
        ax.set_xticks(range(len(labels)), ticks)
        # Above each bar (and its error bar), so that a 0.00 bar's label is not lost in the axis.
        ax.bar_label(bars, labels=texts, padding=4, color="#1d2330")
        ax.margins(y=0.15)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    rate_ax.set_ylim(0, 1.2)  # room for a label above a bar at 1.0
    return fig


def write_comparison(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Plot success rate and mean total reward of each file in `paths` side by side
    (`comparison_figure`, labels by `_labels`) into the PNG `out` (its folder is created).
    Returns `out`. Raises `ReportError` for unreadable input (see `load_episodes`) or an `out`
    that cannot be written."""
    files = [Path(p) for p in paths]
    loaded = [load_episodes(p) for p in files]  # read first: only files are labelled
    labels = _labels(files)
    with _taken_back_on_failure() as made:
        return _write_comparison(list(zip(labels, loaded, strict=True)), Path(out), made)


def _write_comparison(labelled: Sequence[tuple[str, list[Episode]]], target: Path, made: _Made) -> Path:
    made.folder(target.parent)
    with _writing(target.parent):
        comparison_figure(labelled).savefig(made.file(target))
    return target


# ---------------------------------------------------------------- command line


def add_report_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``report`` command to an argparse subparsers object (``func``: `report_command`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "report",
        help="plot a completions.jsonl file (PNGs and an HTML page)",
        description="Plot the trajectories of a completions.jsonl file: reward and component "
        "distributions, success and turns, and reward curves for training files.",
    )
    parser.add_argument(
        "completions", nargs="+",
        help="JSON-lines file(s) of trajectories (envsdk rollout --out); several: also compare.png",
    )
    parser.add_argument(
        "--out-dir", default=None,
        help="output folder (default: <stem>_report/ beside the file; several files: "
        "comparison_report/ in their common folder)",
    )
    parser.set_defaults(func=report_command)
    return parser


def report_command(args: argparse.Namespace) -> int:
    """Run ``envsdk report``: 0 on success, 2 (with the reason on stderr) on unusable input."""
    try:
        import matplotlib  # noqa: F401  (only to fail early with the install hint)
    except ImportError:
        print_err(
            "envsdk report: error: matplotlib is not installed (envsdk's [report] extra): run "
            "pip install -e '.[report]' in the envsdk clone, or pip install matplotlib"
        )
        return 1
    files = [Path(p) for p in args.completions]
    try:
        reports, compare = _report_files(files, Path(args.out_dir) if args.out_dir is not None else None)
    except ReportError as exc:
        print_err(f"envsdk report: error: {exc}")
        return 2
    for report in reports:
        if report.groups is not None:
            # On stderr: stdout lists only the files written, one a line, for scripts.
            print_err(f"{report.html.parent}:\n{report.groups.render()}\n")
        for path in report.plots.values():
            print_out(str(path))
        print_out(str(report.html))
    if compare is not None:
        print_out(str(compare))
    return 0


def _report_files(files: Sequence[Path], out_dir: Path | None) -> tuple[list[Report], Path | None]:
    """The reports of `files` and, for several, their comparison plot (see the module). Every
    file is read and every folder made before anything is written, and a run that fails takes
    back the folders it made: a refusal leaves no half of a report behind."""
    if len(files) == 1:
        return [write_report(files[0], out_dir)], None
    reads = [_read(f) for f in files]  # read first: only files are labelled
    labels = _labels(files)
    folders = [out_dir / label if out_dir else _default_folder(f) for f, label in zip(files, labels, strict=True)]
    owners: dict[Path, Path] = {}
    for file, folder in zip(files, folders, strict=True):
        if out_dir is not None and out_dir.resolve() not in folder.resolve().parents:
            # A label of dots in a path ("a/.." for a/...jsonl) would write beside --out-dir's own files.
            raise ReportError(f"{file}: its label {folder.relative_to(out_dir)} names no folder inside --out-dir {out_dir}")
        # Beside the files, x.jsonl and x.txt in one folder both write x_report/.
        if (owner := owners.setdefault(folder.resolve(), file)) is not file:
            raise ReportError(f"{folder}: the report folder of both {owner} and {file}; give --out-dir")
    common = _common_folder(files)
    if out_dir is None and common == Path(common.anchor):
        raise ReportError(f"the files share no folder but {common}, where comparison_report/ would go: give --out-dir")
    compare = (out_dir or common / "comparison_report") / _COMPARE
    with _taken_back_on_failure() as made:
        for folder in (compare.parent, *folders):
            made.folder(folder)
        reports = [_write(f, read, folder, made) for f, read, folder in zip(files, reads, folders, strict=True)]
        labelled = [(label, read[0]) for label, read in zip(labels, reads, strict=True)]
        return reports, _write_comparison(labelled, compare, made)


def _common_folder(files: Sequence[Path]) -> Path:
    import os

    return Path(os.path.commonpath([str(f.resolve().parent) for f in files]))
