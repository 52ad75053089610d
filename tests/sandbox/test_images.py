"""Base images for offline builds (`envsdk.sandbox.images`) and the script that makes them.

The Dockerfile reading and image-map parsing are pure; the rest runs against real podman with the
base images ``scripts/setup_containers.sh`` built (skipped, with the reason, where they are not).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from envsdk.sandbox.container import (
    ContainerEngine,
    ContainerProvider,
    ImageUnavailableError,
)
from envsdk.sandbox.images import (
    BASE_IMAGES,
    ImageMapError,
    base_image_dir,
    from_names,
    full_name,
    load_image_map,
    prepare_base,
)
from tests._containers import container_engine, container_provider, requires_containers  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup_containers.sh"

# ---------------------------------------------------------------------------- FROM names


def test_from_names_skips_flags_stages_and_scratch() -> None:
    dockerfile = (
        "FROM --platform=linux/amd64 python:3.11-slim-bookworm AS Build\n"
        "RUN make\n"
        "FROM build AS test\n"
        "FROM scratch\n"
        "FROM debian:bookworm-slim\n"
        "COPY --from=build /out /out\n"
        "COPY --from=0 /out /again\n"
        "COPY --chown=1:1 --from=registry.local/tools:2 /bin/tool /bin/\n"
        "from debian:bookworm-slim as final\n"
    )
    assert from_names(dockerfile) == ["python:3.11-slim-bookworm", "debian:bookworm-slim", "registry.local/tools:2"]


def test_from_names_reads_instructions_not_text() -> None:
    """Comments, continued lines and heredoc bodies may say FROM without being one."""
    dockerfile = (
        "# FROM commented:1\n"
        "FROM debian:bookworm-slim\n"
        "RUN echo one \\\n"
        "  # a comment inside a continued line\n"
        "  && echo FROM continued:1\n"
        "RUN <<EOF\n"
        "FROM heredoc:1\n"
        "EOF\n"
        "COPY <<-END /etc/motd\n"
        "\tFROM heredoc:2\n"
        "\tEND\n"
        "FROM \\\n"
        "  python:3.11-slim-bookworm\n"
    )
    assert from_names(dockerfile) == ["debian:bookworm-slim", "python:3.11-slim-bookworm"]


def test_from_names_follows_the_escape_directive() -> None:
    dockerfile = "# escape=`\nFROM debian:bookworm-slim\nRUN echo `\n  FROM continued:1\n"
    assert from_names(dockerfile) == ["debian:bookworm-slim"]


def test_from_names_puts_in_build_argument_defaults() -> None:
    """A build passes no build arguments, so the global ARG defaults are what FROM names."""
    dockerfile = (
        'ARG VERSION=3.11\nARG BASE="debian:bookworm-slim"\nARG UNSET\n'
        "FROM python:${VERSION}-slim-bookworm\nFROM $BASE\nFROM ${UNSET:-debian:bookworm-slim}\n"
        "ARG LATER=ignored:1\n"
    )
    assert from_names(dockerfile) == ["python:3.11-slim-bookworm", "debian:bookworm-slim"]


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        ("ARG BASE\nFROM $BASE\n", "build argument BASE, which has no default"),
        ("FROM ${BASE}\n", "build argument BASE, which has no default"),
        ("ARG BASE=x:1\nFROM ${BASE:?set it}\n", "a substitution this reader does not know"),
    ],
)
def test_from_names_refuses_a_from_it_cannot_know(dockerfile: str, expected: str) -> None:
    with pytest.raises(ImageUnavailableError) as caught:
        from_names(dockerfile, path="tasks/t/environment/Dockerfile")
    message = str(caught.value)
    assert message.startswith("tasks/t/environment/Dockerfile: FROM ") and expected in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("reference", "full"),
    [
        ("debian:bookworm-slim", "docker.io/library/debian:bookworm-slim"),
        ("library/debian:bookworm-slim", "docker.io/library/debian:bookworm-slim"),
        ("index.docker.io/library/debian:bookworm-slim", "docker.io/library/debian:bookworm-slim"),
        ("python", "docker.io/library/python:latest"),
        ("someone/tool:1", "docker.io/someone/tool:1"),
        ("localhost/tool", "localhost/tool:latest"),
        ("registry.local:5000/team/py:3.11", "registry.local:5000/team/py:3.11"),
        ("debian@sha256:" + "ab" * 32, "docker.io/library/debian@sha256:" + "ab" * 32),
    ],
)
def test_full_name_is_what_engines_resolve_a_name_to(reference: str, full: str) -> None:
    assert full_name(reference) == full


@pytest.mark.parametrize("reference", ["", "Debian:12", "debian:", "a b", "-x", "x:tag with space"])
def test_full_name_refuses_what_is_no_image_name(reference: str) -> None:
    with pytest.raises(ValueError, match="not an image reference"):
        full_name(reference)


def test_every_base_image_is_a_bookworm_name() -> None:
    """Only names whose content is what the script builds (python:3.11-slim follows Debian's
    newest release, so it is not one)."""
    assert set(BASE_IMAGES) == {"debian:bookworm-slim", "python:3.11-slim-bookworm"}
    assert all(file.endswith(".tar") for file in BASE_IMAGES.values())


# ---------------------------------------------------------------------------- image maps


def test_image_map_is_keyed_by_full_names(tmp_path: Path) -> None:
    """Values are image names, or archive files (relative ones from the map's folder)."""
    (tmp_path / "archives").mkdir()
    (tmp_path / "archives" / "py.tar").write_bytes(b"")
    path = tmp_path / "maps" / "images.toml"
    path.parent.mkdir()
    path.write_text(
        '"python:3.11-slim" = "registry.local/py:3.11"\n"ghcr.io/a/b:1" = "localhost/b:1"\n'
        '"python:3.12-slim" = "../archives/py.tar"\n'
    )
    assert load_image_map(path) == {
        "docker.io/library/python:3.11-slim": "registry.local/py:3.11",
        "ghcr.io/a/b:1": "localhost/b:1",
        "docker.io/library/python:3.12-slim": str(tmp_path / "archives" / "py.tar"),
    }


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'"python:3.11-slim" = registry.local/py\n', "not TOML"),
        (b"\xff\xfe\n", "not UTF-8"),
        (b'"python:3.11-slim" = 3\n', "the value must be an image name in quotes"),
        (b'[images]\n"python:3.11-slim" = "x:1"\n', "the value must be an image name in quotes"),
        (b'"Not An Image" = "x:1"\n', "'Not An Image' is not an image name"),
        (b'"python:3.11-slim" = "no good"\n', "'no good' is neither an image name nor an archive path"),
        (b'"python:3.11-slim" = "./absent.tar"\n', "no such image archive"),
    ],
)
def test_image_map_errors_are_one_line_naming_the_file(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "images.toml"
    path.write_bytes(content)
    with pytest.raises(ImageMapError) as caught:
        load_image_map(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and expected in message
    assert "\n" not in message


def test_a_missing_image_map_is_named(tmp_path: Path) -> None:
    with pytest.raises(ImageMapError, match=f"^{tmp_path}/absent.toml: no such image map file"):
        load_image_map(tmp_path / "absent.toml")


# ---------------------------------------------------------------------------- the script


def test_setup_script_refuses_without_root_or_apt(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("setpriv (util-linux) is needed to run the script as another user")
        as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(SCRIPT)]
        result = subprocess.run(as_nobody, check=False, capture_output=True, text=True, timeout=30)
    else:
        result = subprocess.run(["bash", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        (
            "setup_containers.sh: must run as root (it installs Debian packages and builds root filesystems): "
            "e.g. sudo bash scripts/setup_containers.sh"
        )
    ]
    if os.geteuid() == 0:
        bash = shutil.which("bash") or "/bin/bash"
        result = subprocess.run([bash, str(SCRIPT)], check=False, capture_output=True, text=True, timeout=30,
                                env={**os.environ, "PATH": str(tmp_path)})
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            (
                "setup_containers.sh: apt-get not found: this script installs Debian packages (podman, runc, "
                "mmdebstrap) and needs a Debian-based machine"
            )
        ]


@pytest.mark.timeout(60)
def test_setup_script_keeps_what_exists(tmp_path: Path) -> None:
    """A second run builds nothing: files already there are kept (and said so)."""
    installed = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}\n", "podman", "runc", "mmdebstrap"], check=False, capture_output=True, text=True,
    ) if shutil.which("dpkg-query") else None
    if os.geteuid() != 0 or installed is None or installed.stdout.count("install ok installed") != 3:
        pytest.skip("needs root with podman, runc and mmdebstrap installed (else the script would install them)")
    for file in BASE_IMAGES.values():
        (tmp_path / file).write_bytes(b"x" * 1024)
    result = subprocess.run(["bash", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=50,
                            env={**os.environ, "ENVSDK_BASE_IMAGE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "setup_containers.sh: podman runc mmdebstrap already installed"
    for file in BASE_IMAGES.values():
        assert f"setup_containers.sh: {tmp_path / file} exists (1 MB), kept" in lines
    assert lines[-1].startswith("setup_containers.sh: done in ")
    assert "building" not in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == sorted(BASE_IMAGES.values())


# ---------------------------------------------------------------------------- with podman


def _remove_images(engine: ContainerEngine, *refs: str) -> None:
    engine.call(["rmi", "--force", *refs], timeout=60, check=False)


@requires_containers
@pytest.mark.timeout(60)
def test_a_missing_base_tar_is_refused_naming_the_from_and_both_remedies(
    container_engine: ContainerEngine, tmp_path: Path,  # noqa: F811
) -> None:
    name = "envsdk-test/missing-base:1"
    with pytest.raises(ImageUnavailableError) as caught:
        prepare_base(container_engine, [name], image_map={}, pull=False, bases={name: "absent.tar"}, base_dir=tmp_path)
    message = str(caught.value)
    assert message.startswith(f"FROM {name}: not in the container store, and its root filesystem "
                              f"{tmp_path / 'absent.tar'} is missing: ")
    assert "bash scripts/setup_containers.sh` (as root)" in message and "ENVSDK_IMAGE_MAP" in message
    assert "\n" not in message


@requires_containers
@pytest.mark.timeout(60)
def test_an_unknown_from_is_refused_with_every_way_to_have_it(container_engine: ContainerEngine) -> None:  # noqa: F811
    name = "registry.invalid/team/base:1"
    with pytest.raises(ImageUnavailableError) as caught:
        prepare_base(container_engine, [name], image_map={}, pull=False)
    message = str(caught.value)
    assert message.startswith(f"FROM {name}: not in the container store and no registry is used")
    for way in ("ENVSDK_IMAGE_MAP", "setup_containers.sh", "ENVSDK_PULL=1", "debian:bookworm-slim"):
        assert way in message
    assert "\n" not in message
    # Where pulls are allowed, the same name is left to the engine's pull.
    assert prepare_base(container_engine, [name], image_map={}, pull=True) == {name: "left to pull"}


@requires_containers
@pytest.mark.timeout(60)
def test_a_map_to_an_image_not_in_the_store_is_refused_naming_the_map(
    container_engine: ContainerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    path = tmp_path / "images.toml"
    path.write_text('"envsdk-made-up:1" = "localhost/envsdk-absent:1"\n')
    monkeypatch.setenv("ENVSDK_IMAGE_MAP", str(path))
    with pytest.raises(ImageUnavailableError) as caught:
        prepare_base(container_engine, ["envsdk-made-up:1"], pull=False)
    assert str(caught.value).startswith(
        f"FROM envsdk-made-up:1: the image map {path} maps it to localhost/envsdk-absent:1, "
        "which is not in the container store"
    )
    path.write_text("not toml\n")
    with pytest.raises(ImageMapError, match=f"^{path}: not TOML"):
        prepare_base(container_engine, ["envsdk-made-up:1"], pull=False)


@requires_containers
@pytest.mark.timeout(120)
def test_a_base_tar_is_loaded_once_by_concurrent_preparers(container_engine: ContainerEngine) -> None:  # noqa: F811
    """Two preparers of the same name at once: one imports, the other waits and finds it."""
    name = "envsdk-test/loaded-base:1"
    bases = {name: BASE_IMAGES["debian:bookworm-slim"]}
    _remove_images(container_engine, full_name(name))  # left by a run that was killed
    results: list[dict[str, str]] = []
    errors: list[BaseException] = []

    def prepare() -> None:
        try:
            results.append(prepare_base(container_engine, [name], image_map={}, pull=False, bases=bases))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=prepare) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(100)
        assert not errors, errors
        hows = sorted(result[name] for result in results)
        assert hows == ["in store", f"loaded from {base_image_dir() / bases[name]}"]
        assert container_engine.image_exists(full_name(name)) and container_engine.image_exists(name)
        config = container_engine.call(["image", "inspect", "--format", "{{json .Config.Cmd}} {{json .Config.Env}}",
                                        name], timeout=60).stdout.decode().split()
        assert config == ['["bash"]', '["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]']
    finally:
        _remove_images(container_engine, full_name(name))


@requires_containers
@pytest.mark.timeout(180)
def test_a_mapped_local_image_builds_offline(
    container_provider: ContainerProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    """An offline cluster's own image stands in for a FROM name no registry serves here."""
    engine = container_provider.engine
    token = secrets.token_hex(8)  # a new build context each run, so the build is not a cached one
    local, made_up = "localhost/envsdk-test-local:1", "envsdk-made-up-base:1"
    _remove_images(engine, full_name(made_up), local)  # left by a run that was killed
    engine.tag(full_name("debian:bookworm-slim"), local)
    (tmp_path / "images.toml").write_text(f'"{made_up}" = "{local}"\n')
    monkeypatch.setenv("ENVSDK_IMAGE_MAP", str(tmp_path / "images.toml"))
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {made_up}\nRUN echo {token} > /mapped.txt\n")
    ref = None
    try:
        ref = container_provider.build_image(context, name="mapped")
        with container_provider.start(ref) as box:
            assert box.read_file("/mapped.txt") == f"{token}\n".encode()
    finally:
        _remove_images(engine, *[r for r in (ref, full_name(made_up), local) if r])


@requires_containers
@pytest.mark.timeout(120)
def test_python_base_is_like_the_stock_slim_image(container_provider: ContainerProvider) -> None:  # noqa: F811
    """Debian's Python 3.11 where the stock image has it, pip working with no network, no docs,
    the stock LANG, and no service started by a package install."""
    with container_provider.start("python:3.11-slim-bookworm") as box:
        script = (
            "set -e; readlink /usr/local/bin/python3 /usr/local/bin/python; python --version; "
            "python3 -c 'import sys; print(sys.executable)'; pip --version | cut -d' ' -f1; "
            "ls /usr/share/doc/bash; ls /usr/share/man 2>/dev/null | wc -l; echo \"$LANG\"; tail -n 1 /usr/sbin/policy-rc.d"
        )
        run = box.bash(script)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.decode().splitlines()
        assert lines[:2] == ["/usr/bin/python3", "/usr/bin/python"] and lines[2].startswith("Python 3.11.")
        assert lines[3:] == ["/usr/local/bin/python3", "pip", "copyright", "0", "C.UTF-8", "exit 101"]
        # pip installs from a local folder with no network, as root, like the stock image's pip.
        box.write_file("/tmp/pkg/m.py", b"def f():\n    return 7\n")
        box.write_file("/tmp/pkg/setup.py", b"from setuptools import setup\nsetup(name='m', version='1', py_modules=['m'])\n")
        run = box.bash("pip install --no-index --no-build-isolation /tmp/pkg >/dev/null 2>&1 && cd / && python -c 'import m; print(m.f())'",
                       timeout=60)
        assert (run.returncode, run.stdout) == (0, b"7\n"), run.stderr


@requires_containers
@pytest.mark.timeout(120)
def test_a_from_mapped_to_an_image_archive_is_loaded_from_it(
    container_engine: ContainerEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    """An offline cluster keeps its images as ``save`` archives: the map names the file."""
    name = "envsdk-archived-base:1"
    _remove_images(container_engine, full_name(name))  # left by a run that was killed
    container_engine.call(["save", "-o", str(tmp_path / "base.tar"), "debian:bookworm-slim"], timeout=100)
    (tmp_path / "images.toml").write_text(f'"{name}" = "./base.tar"\n')
    monkeypatch.setenv("ENVSDK_IMAGE_MAP", str(tmp_path / "images.toml"))
    try:
        assert prepare_base(container_engine, [name], pull=False) == {
            name: "mapped from docker.io/library/debian:bookworm-slim"
        }
        assert container_engine.image_exists(name)
        assert prepare_base(container_engine, [name], pull=False) == {name: "in store"}
    finally:
        _remove_images(container_engine, full_name(name))
