"""What container tests share: `requires_containers` (skip, saying exactly what is missing) and
fixtures giving a podman engine with the base images loaded and a `ContainerProvider` on it.

Import what a test module uses: ``from tests._containers import container_provider,
requires_containers``. The base images are loaded into the store once per test run (and stay
there for the next run: the store is the engine's own, kept until reboot).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterator

import pytest

from envsdk.sandbox.container import ContainerEngine, ContainerLimits, ContainerProvider
from envsdk.sandbox.images import BASE_IMAGES, base_image_dir, prepare_base

SETUP = "run `bash scripts/setup_containers.sh`"

#: Small limits so that container tests end in seconds.
TEST_CONTAINER_LIMITS = ContainerLimits(
    cpus=1.0, memory_mb=256, storage_mb=128, pids=64, output_bytes=64 << 10, timeout_s=10.0,
    start_timeout_s=30.0, build_timeout_s=120.0,
)


@functools.cache
def missing_for_containers() -> str | None:
    """Why container tests cannot run here (the first thing missing), or None when they can."""
    if os.geteuid() != 0:
        return "container tests need root: podman runs as root here (rootless podman cannot hold limits on this machine)"
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: {SETUP}"
    for name, file in BASE_IMAGES.items():
        tar = base_image_dir() / file
        if not tar.is_file():
            return f"base image {name} is missing ({tar}): {SETUP}"
    return None


#: Marks a test that needs the container engine. tests/conftest.py skips it, saying what is
#: missing, where the engine cannot run, and otherwise hands every such test to one xdist worker,
#: one at a time: they share the engine's store (its disk budget, its images, its lock).
requires_containers = pytest.mark.containers


@functools.cache
def _engine_with_bases() -> ContainerEngine:
    engine = ContainerEngine.detect("podman")
    prepare_base(engine, list(BASE_IMAGES), image_map={}, pull=False)
    return engine


@pytest.fixture(scope="session")
def container_engine() -> ContainerEngine:
    """The podman engine (its own store) with both base images in it; once per test run."""
    missing = missing_for_containers()
    if missing is not None:
        pytest.skip(missing)
    return _engine_with_bases()


@pytest.fixture(scope="module")
def container_provider(container_engine: ContainerEngine) -> Iterator[ContainerProvider]:
    """A provider on `container_engine` with `TEST_CONTAINER_LIMITS`, shared by a module's tests
    (each test closes the containers it starts)."""
    yield ContainerProvider(container_engine, limits=TEST_CONTAINER_LIMITS)
