"""A tiny local model and a real Sudoku server on 127.0.0.1 for the TRL integration tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("trl")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from envsdk.testing import running_server
from envsdk.tiny_model import build_tiny_model


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def sudoku_url() -> Iterator[str]:
    from servers.sudoku.app import create_sudoku_app

    with running_server(create_sudoku_app(max_concurrent_envs=32)) as url:
        yield url
