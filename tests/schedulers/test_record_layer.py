"""The record schema sits below the schedulers: `envsdk.records` holds `Trajectory` and
`StepRecord` and imports nothing of `envsdk.schedulers`, not even for type checking (the two
modules used to import each other), and the layers contract in pyproject.toml keeps it so."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import envsdk.records as records
import envsdk.schedulers as schedulers

REPO = Path(__file__).resolve().parents[2]


def test_records_import_nothing_from_the_schedulers() -> None:
    tree = ast.parse(Path(records.__file__).read_text(encoding="utf-8"))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert not [name for name in imported if name and name.startswith(("envsdk.schedulers", "envsdk.policies"))]
    # The schedulers use the record's own classes: one definition each.
    assert schedulers.Trajectory is records.Trajectory and schedulers.StepRecord is records.StepRecord


def test_the_layers_contract_puts_records_and_model_text_below_the_schedulers() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    layers = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    assert layers.index("envsdk.records | envsdk.formats") > layers.index("envsdk.schedulers")
