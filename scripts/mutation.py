"""Mutation testing of the core pure-logic modules with mutmut (the ``mutation`` extra).

    .venv/bin/python scripts/mutation.py                # every module below, scores and survivors
    .venv/bin/python scripts/mutation.py sudoku records # some of them
    .venv/bin/python scripts/mutation.py --diffs        # each survivor's diff too

mutmut writes a ``mutants/`` copy of the tree, so the run works on a copy of this checkout (its
tracked files and the untracked ones git does not ignore) in a temporary folder, removed at the end
(``--keep`` keeps it and says where). Only the functions named in `MODULES` are mutated: the
modules' pure logic, which the fast unit tests in `TESTS` exercise in milliseconds. Each mutant runs
only the tests that call its function (mutmut records which do in a first, clean run).

The score per module is mutmut's own verdict for each mutant, counted: killed (a test failed, or
the mutant ran past its time limit) over all mutants checked. A mutant no test reaches counts as a
survivor. Not part of the test command: it takes minutes (bench/MUTATION.md says how many).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Per module: its file and the functions mutated (mutmut's names: ``x_<function>`` and
#: ``xǁ<Class>ǁ<method>``). Properties are not mutated by mutmut (it leaves decorated functions).
MODULES: dict[str, tuple[str, list[str]]] = {
    "protocol": ("envsdk/protocol.py", ["*"]),
    "sudoku": ("envsdk/games/sudoku.py", ["*"]),
    # The record schema and its statistics; the file holding and reading (locks, atomic writes,
    # JSON Lines readers) is left out: its tests are other processes, seconds each.
    "records": (
        "envsdk/records.py",
        [
            "xǁStepRecordǁ*", "xǁTrajectoryǁ*", "x__stated", "x_stated_success", "x_done_reason",
            "x_finite_number", "x_quantile", "x_mean_and_std", "x_number_text", "x_success_text",
            "x_part_basis", "x_basis_labels", "x__with_reported", "x_episode_components",
            "x_trajectory_record", "x__final_observation", "x_check_record", "x_summary_facts",
            "x_record_bytes", "x_record_line", "x_text_line",
        ],
    ),
    # pass@k, groups and their summary, and re-scoring a record; not run planning, resume, files
    # or the commands' argument parsing (end-to-end CLI tests cover those).
    "evaluate": (
        "envsdk/evaluate.py",
        [
            "x_pass_at_k", "x__ks", "x_example_of", "x_natural_key", "x_summarize_groups",
            "xǁEvalSummaryǁ*", "x_summary_text", "x_rescore_records", "x_rescore_record",
            "x__reward_of", "x__truth", "x__stated", "x_weighted_score", "x_format_penalty_of",
            "x__as_float",
        ],
    ),
}

#: The fast tests that exercise the modules (no server process, no CLI subprocess).
TESTS = [
    "tests/games/test_sudoku_board_and_moves.py",
    "tests/schedulers/test_sudoku_reward_and_hints.py",
    "tests/policies/test_scripted.py",
    "tests/test_protocol_frames.py",
    "tests/perf/test_fast_paths.py::test_encode_observation_writes_the_same_text_as_the_model_path",
    "tests/perf/test_fast_paths.py::test_decode_request_agrees_with_json_loads_and_model_validate",
    "tests/server/test_bad_input.py",
    "tests/client/test_config.py",
    "tests/eval/test_records_schema.py",
    "tests/eval/test_summary_of_written_records.py",
    "tests/eval/test_records_written.py::test_records_file_lines_end_at_a_newline_alone",
    "tests/eval/test_records_written.py::test_a_record_line_reads_back_as_json_reads_the_record",
    "tests/eval/test_groups_and_rescoring.py",
    "tests/eval/test_groups_cli.py::test_pass_at_k_is_the_share_of_k_subsets_with_a_success",
    "tests/eval/test_groups_cli.py::test_groups_of_records_without_a_tag_are_groups_of_one",
    "tests/eval/test_groups_cli.py::test_overall_pass_at_k_covers_only_the_k_every_example_reaches",
    "tests/eval/test_groups_cli.py::test_a_large_group_gets_pass_at_k_for_the_shown_ks_only",
    "tests/eval/test_groups_cli.py::test_the_summary_of_rewards_near_the_largest_float_is_finite",
    "tests/eval/test_groups_cli.py::test_every_k_up_to_ten_is_shown_then_powers_of_two",
    "tests/eval/test_groups_cli.py::test_a_run_cut_short_says_what_its_run_file_planned",
    "tests/eval/test_groups_cli.py::test_records_that_repeat_a_pair_are_counted_and_said",
]

_KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def copy_checkout(target: Path, left_out: list[str]) -> None:
    """The working tree's files (tracked, and untracked ones not ignored) copied into `target`, but
    for the paths `left_out` (files or folders)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        skipped = any(name == path or name.startswith(path.rstrip("/") + "/") for path in left_out)
        if source.is_file() and not skipped and not name.startswith("test-artifacts/"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def write_config(target: Path, tests: list[str]) -> None:
    files = "".join(f"    {path}\n" for path, _ in MODULES.values())
    selection = "".join(f"    {test}\n" for test in tests)
    (target / "setup.cfg").write_text(
        "[mutmut]\nsource_paths = envsdk\n"
        f"only_mutate =\n{files}"
        "also_copy =\n    servers\n    examples\n"
        "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n"
        f"pytest_add_cli_args_test_selection =\n{selection}",
        encoding="utf-8",
    )


def patterns(names: list[str]) -> list[str]:
    return [
        f"{MODULES[name][0][:-3].replace('/', '.')}.{function}__mutmut_*"
        for name in names
        for function in MODULES[name][1]
    ]


def verdicts(target: Path, names: list[str]) -> dict[str, dict[str, str]]:
    """mutmut's status of each mutant it checked, per module (from its ``.meta`` files)."""
    from mutmut.stats import status_by_exit_code

    wanted = patterns(names)
    found: dict[str, dict[str, str]] = {}
    for name in names:
        meta = json.loads((target / "mutants" / f"{MODULES[name][0]}.meta").read_text(encoding="utf-8"))
        found[name] = {
            key: status_by_exit_code[code]
            for key, code in meta["exit_code_by_key"].items()
            if any(fnmatch.fnmatchcase(key, p) for p in wanted)
        }
    return found


def _number(key: str) -> tuple[str, int]:
    function, _, n = key.rpartition("__mutmut_")
    return function, int(n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument("--diffs", action="store_true", help="print each survivor's diff")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy (mutmut's results in it)")
    parser.add_argument(
        "--leave-out", action="append", default=[], metavar="PATH",
        help="a test file or folder left out of the copy, to score the tests without it (repeatable)",
    )
    args = parser.parse_args()
    names = args.modules or list(MODULES)
    unknown = [name for name in names if name not in MODULES]
    if unknown:
        parser.error(f"no module {', '.join(unknown)}; choose from {', '.join(MODULES)}")
    mutmut = Path(sys.executable).parent / "mutmut"
    if not mutmut.exists():
        print("mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2
    target = Path(tempfile.mkdtemp(prefix="envsdk-mutation-"))
    began = time.monotonic()
    try:
        copy_checkout(target, args.leave_out)
        tests = [t for t in TESTS if (target / t.partition("::")[0]).is_file()]
        write_config(target, tests)
        run = subprocess.run(
            [str(mutmut), "run", "--max-children", str(args.jobs), *patterns(names)],
            cwd=target, capture_output=True, text=True, check=False,
        )
        if run.returncode != 0:
            print(run.stdout[-4000:], run.stderr[-4000:], sep="\n", file=sys.stderr)
            return run.returncode
        found = verdicts(target, names)
        print(f"mutmut {_version()}, {len(tests)} test files or tests, {time.monotonic() - began:.0f} s\n")
        print(f"{'module':<10}{'mutants':>8}{'killed':>8}{'survived':>9}{'no tests':>9}{'score':>8}")
        for name in names:
            states = list(found[name].values())
            killed = sum(s in _KILLED for s in states)
            checked = sum(s not in ("skipped", "not checked") for s in states)
            score = killed / checked if checked else 0.0
            print(f"{name:<10}{len(states):>8}{killed:>8}{states.count('survived'):>9}"
                  f"{states.count('no tests'):>9}{score:>8.1%}")
        for name in names:
            alive = sorted((k for k, s in found[name].items() if s not in _KILLED), key=_number)
            if alive:
                print(f"\n{name}: {len(alive)} not killed")
            for key in alive:
                print(f"  {key} ({found[name][key]})")
                if args.diffs:
                    shown = subprocess.run(
                        [str(mutmut), "show", key], cwd=target, capture_output=True, text=True, check=False
                    )
                    diff = [line for line in shown.stdout.splitlines() if re.match(r"[-+](?![-+])", line)]
                    print("".join(f"      {line}\n" for line in diff), end="")
        return 0
    finally:
        if args.keep:
            print(f"\nkept: {target}")
        else:
            shutil.rmtree(target, ignore_errors=True)


def _version() -> str:
    from importlib.metadata import version

    return version("mutmut")


if __name__ == "__main__":
    sys.exit(main())
