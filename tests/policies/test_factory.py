"""make_policy and the package surface: names resolve, extras are imported only on use."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from envsdk import policies
from envsdk.policies import (
    POLICY_NAMES,
    FrozenLakeOraclePolicy,
    Policy,
    RandomPolicy,
    SudokuOraclePolicy,
    make_policy,
)


@pytest.mark.parametrize(
    ("name", "env_name", "cls"),
    [
        ("oracle", "Sudoku-v0", SudokuOraclePolicy),
        ("oracle", "frozen_lake", FrozenLakeOraclePolicy),
        ("random", "sudoku", RandomPolicy),
        ("random", "FrozenLake", RandomPolicy),
    ],
)
def test_make_policy_builds_scripted_policies(name: str, env_name: str, cls: type[Policy]) -> None:
    assert type(make_policy(name, env_name)) is cls


async def test_make_policy_passes_keyword_arguments() -> None:
    a = make_policy("random", "sudoku", seed=4)
    b = RandomPolicy("sudoku", seed=4)
    assert [await a.act([]) for _ in range(5)] == [await b.act([]) for _ in range(5)]


async def test_make_policy_openai_builds_a_client_without_contacting_the_server() -> None:
    policy = make_policy("openai", "sudoku", base_url="http://127.0.0.1:9", model="m")
    assert isinstance(policy, policies.OpenAIChatPolicy)
    assert policy.url == "http://127.0.0.1:9/v1/chat/completions"
    await policy.aclose()


def test_make_policy_refuses_unknown_names_and_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="auto, oracle, random, openai, transformers"):
        make_policy("gpt", "sudoku")
    with pytest.raises(ValueError, match="supported: sudoku, frozen_lake"):
        make_policy("oracle", "chess")
    assert POLICY_NAMES == ("auto", "oracle", "random", "openai", "transformers", "noop")


def test_every_name_in_all_resolves() -> None:
    """Each exported name, the lazily imported ones included, is the object its own module defines
    under that name (a class or function bears the name too), and each is exported once."""
    pytest.importorskip("transformers", reason="TransformersPolicy needs transformers")
    assert len(set(policies.__all__)) == len(policies.__all__)
    for name in policies.__all__:
        value = getattr(policies, name)
        home = getattr(value, "__module__", None)
        if isinstance(value, type) or (callable(value) and home is not None and home.startswith("envsdk.")):
            assert value.__name__ == name, name
            assert getattr(importlib.import_module(value.__module__), name) is value, name
        else:  # a constant or a type alias: defined in the package itself
            assert vars(policies)[name] is value, name


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        policies.Nope  # noqa: B018


@pytest.mark.timeout(60)
def test_importing_the_package_does_not_import_model_extras() -> None:
    code = (
        "import sys, envsdk.policies; "
        "print(sorted(m for m in ('torch', 'transformers', 'httpx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    assert out.stdout.strip() == "[]"
