"""Shared fixtures for policy tests: one tiny model per session, one thread for torch.

HF_HUB_OFFLINE is set before anything imports transformers so that no test can reach a hub.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 checkpoint with its tokenizer (skipped without the model extras)."""
    pytest.importorskip("transformers", reason="needs transformers (envsdk[train]) for a model")
    torch = pytest.importorskip("torch", reason="needs torch (envsdk[train]) for a model")
    # Two cores are shared by everyone's tests.
    torch.set_num_threads(1)
    from envsdk.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), seed=0)
