"""Base images for offline builds: what a Dockerfile's ``FROM`` names, and how each is had.

Task images are built with no registry (``--pull=never``), so every image a Dockerfile starts
from must already be in the container store. `prepare_base` makes it so, for each name, in this
order:

1. it is in the store already (under the name as written, as the build will look it up): done;
2. an image map names another image for it (`load_image_map`; the file named by
   ``ENVSDK_IMAGE_MAP``, TOML, one line per name: ``"python:3.11-slim" = "registry.local/py:3.11"``,
   or an image archive file, ``"python:3.11-slim" = "/data/images/py.tar"``): that image (loaded
   from the archive; made first when it is one of the base images below; pulled when pulls are
   allowed) is tagged with the name;
3. it is one of `BASE_IMAGES`, whose root filesystem ``scripts/setup_containers.sh`` builds from
   Debian's packages into ``ENVSDK_BASE_IMAGE_DIR`` (default ``/var/lib/envsdk/base-images``):
   the tarball is imported under the name's full form (``docker.io/library/<name>``, which the
   short name in ``FROM`` resolves to), with the stock image's ``PATH``, ``LANG`` and ``CMD``;
4. otherwise `ImageUnavailableError`, one line naming the ``FROM`` and the ways to have it.

With ``ENVSDK_PULL=1`` (`pull_allowed`) a registry is reachable and builds may pull: steps 1
and 2 still hold (an explicit map wins), the rest is left to the engine, so the stock images
are used rather than the ones built here.

Two processes preparing the same name at once do not both import it: each name is prepared
under a file lock (``/var/lib/envsdk/locks`` as root), and looked up again once the lock is held.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from envsdk.sandbox._locks import lock_by
from envsdk.sandbox.container import (
    ContainerEngine,
    ContainerError,
    ImageUnavailableError,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "BASE_IMAGES",
    "DEFAULT_BASE_IMAGE_DIR",
    "ImageMapError",
    "base_image_dir",
    "from_names",
    "full_name",
    "load_image_map",
    "prepare_base",
    "pull_allowed",
]

logger = logging.getLogger("envsdk.sandbox")

#: The base images ``scripts/setup_containers.sh`` builds (FROM name -> root filesystem tarball
#: in `base_image_dir`). Only names whose content is what is built: ``python:3.11-slim`` is
#: left out, because that stock tag follows Debian's newest release, not bookworm.
BASE_IMAGES: dict[str, str] = {
    "debian:bookworm-slim": "debian-bookworm-slim.tar",
    "python:3.11-slim-bookworm": "python-3.11-slim-bookworm.tar",
}
#: What an imported root filesystem lacks of the stock image's configuration, by tarball.
#: (An import has no environment and no command; the stock images set these.)
_STOCK_PATH = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_IMAGE_CHANGES: dict[str, tuple[str, ...]] = {
    "debian-bookworm-slim.tar": (_STOCK_PATH, 'CMD ["bash"]'),
    "python-3.11-slim-bookworm.tar": (_STOCK_PATH, "ENV LANG=C.UTF-8", 'CMD ["python3"]'),
}
DEFAULT_BASE_IMAGE_DIR = Path("/var/lib/envsdk/base-images")
#: Where the per-name locks live when this process may write there (as root).
LOCK_DIR = Path("/var/lib/envsdk/locks")
#: How long a preparation waits for another process preparing the same name.
LOCK_WAIT_S = 900.0
SETUP_HINT = "build it with `bash scripts/setup_containers.sh` (as root)"
MAP_HINT = "map it to a local image in an image map file named by ENVSDK_IMAGE_MAP (a TOML line \"{name}\" = \"<local image>\")"

# An image reference, as Docker's grammar has it: [domain/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?)"
_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?"
)
# $NAME, ${NAME}, ${NAME:-word}, ${NAME:+word} in a FROM line.
_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_]\w*)(?:(?P<op>:[-+])(?P<word>[^}]*))?\}|(?P<bare>[A-Za-z_]\w*))")
_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_]\w*)\2")


class ImageMapError(ContainerError):
    """An image map file that cannot be used (missing, not TOML, or a line that is not
    ``"<FROM name>" = "<image>"``); the message names the file."""


def base_image_dir() -> Path:
    """Where the base images' root filesystems are: ``ENVSDK_BASE_IMAGE_DIR`` or the default."""
    return Path(os.environ.get("ENVSDK_BASE_IMAGE_DIR") or DEFAULT_BASE_IMAGE_DIR)


def pull_allowed() -> bool:
    """Whether builds may pull what the store lacks from a registry (``ENVSDK_PULL=1``)."""
    return os.environ.get("ENVSDK_PULL", "").strip().lower() in ("1", "true", "yes")


def full_name(reference: str) -> str:
    """`reference` in its full form, as engines resolve a short name: ``debian:bookworm-slim``
    -> ``docker.io/library/debian:bookworm-slim``, ``ghcr.io/x/y`` -> ``ghcr.io/x/y:latest``.
    Raises ValueError when it is not an image reference."""
    match = _REFERENCE.fullmatch(reference)
    if match is None:
        raise ValueError(f"not an image reference: {reference!r}")
    domain, path, tag, digest = match.group("domain", "path", "tag", "digest")
    # The first component is a registry only when it looks like a host (Docker's rule).
    if domain is not None and "." not in domain and ":" not in domain and domain != "localhost" and domain.lower() == domain:
        domain, path = None, f"{domain}/{path}"
    if domain is None or domain in ("index.docker.io", "registry-1.docker.io"):
        domain = "docker.io"
    if domain == "docker.io" and "/" not in path:
        path = f"library/{path}"
    name = f"{domain}/{path}"
    if tag is not None or digest is None:
        name += f":{tag or 'latest'}"
    return name + (f"@{digest}" if digest else "")


_BASES_BY_FULL_NAME = {full_name(name): file for name, file in BASE_IMAGES.items()}


# ---------------------------------------------------------------------------- Dockerfiles


def _logical_lines(text: str) -> Iterator[str]:
    """The instructions of a Dockerfile, one string each: continuation lines joined, comments
    and blank lines dropped, the bodies of heredocs (``RUN <<EOF`` ... ``EOF``) skipped."""
    lines = text.splitlines()
    escape = "\\"
    for line in lines:  # parser directives: only at the very top
        directive = re.fullmatch(r"\s*#\s*([A-Za-z]\w*)\s*=\s*(\S*)\s*", line)
        if directive is None:
            break
        if directive.group(1).lower() == "escape" and directive.group(2) in ("\\", "`"):
            escape = directive.group(2)
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = []
        while True:
            stripped = line.rstrip()
            if not stripped.endswith(escape):
                parts.append(line)
                break
            parts.append(stripped[: -len(escape)])
            while index < len(lines) and (not lines[index].strip() or lines[index].lstrip().startswith("#")):
                index += 1
            if index == len(lines):
                break
            line = lines[index]
            index += 1
        instruction = "".join(parts).strip()
        if not instruction:
            continue
        if instruction.split(None, 1)[0].upper() in ("RUN", "COPY", "ADD"):
            for strip_tabs, _, word in _HEREDOC.findall(instruction):
                while index < len(lines):
                    body = lines[index].lstrip("\t") if strip_tabs else lines[index]
                    index += 1
                    if body == word:
                        break
        yield instruction


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _substitute(raw: str, args: Mapping[str, str | None], where: str) -> str:
    """`raw` with the global build arguments' defaults put in (the build passes none)."""

    def value(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        have = args.get(name)
        op = match.group("op")
        if op == ":-":
            return have if have else match.group("word")
        if op == ":+":
            return match.group("word") if have else ""
        if have is None:
            raise ImageUnavailableError(
                f"{where}FROM {raw}: names its image through build argument {name}, which has no default, and "
                f"builds here pass no build arguments: write the image name, or give it one (ARG {name}=<image>)"
            )
        return have

    result = _VARIABLE.sub(value, raw)
    if "$" in result:
        raise ImageUnavailableError(
            f"{where}FROM {raw}: a substitution this reader does not know ($NAME, ${{NAME}}, ${{NAME:-word}} and "
            "${NAME:+word} are known): write the image name"
        )
    return result


def from_names(dockerfile_text: str, *, path: str | os.PathLike[str] | None = None) -> list[str]:
    """The images a Dockerfile builds on, in order, each once, as written: the image of every
    ``FROM`` (``--platform=`` and other flags skipped; ``scratch`` and earlier stages' names,
    ``FROM builder``, are not images) and of every ``COPY --from=<image>``. Build arguments
    declared before the first ``FROM`` with a default are put in, as a build without
    ``--build-arg`` does; one without a default is refused (`ImageUnavailableError`, naming
    `path` when given), since the base must be known before the build."""
    where = f"{os.fspath(path)}: " if path is not None else ""
    args: dict[str, str | None] = {}
    stages: set[str] = set()
    names: list[str] = []
    seen_from = False
    for instruction in _logical_lines(dockerfile_text):
        keyword, *words = instruction.split()
        keyword = keyword.upper()
        if keyword == "ARG" and not seen_from:
            for word in words:
                name, has_default, default = word.partition("=")
                args[name] = _unquote(default) if has_default else None
        elif keyword == "FROM":
            seen_from = True
            operands = [word for word in words if not word.startswith("--")]
            if not operands:
                continue  # the build says what is wrong
            image = _substitute(operands[0], args, where) if "$" in operands[0] else operands[0]
            if image.lower() != "scratch" and image.lower() not in stages and image not in names:
                names.append(image)
            if len(operands) >= 3 and operands[1].lower() == "as":
                stages.add(operands[2].lower())
        elif keyword == "COPY":
            for word in words:
                if not word.startswith("--"):
                    break
                if word.lower().startswith("--from="):
                    source = word.split("=", 1)[1]
                    if source and "$" not in source and not source.isdigit() and source.lower() not in stages \
                            and source not in names:
                        names.append(source)
    return names


# ---------------------------------------------------------------------------- image maps


def load_image_map(path: str | os.PathLike[str]) -> dict[str, str]:
    """The image map in TOML file `path`, keyed by the FROM names' full form (`full_name`). Each
    line is ``"<FROM name>" = "<image>"`` or ``"<FROM name>" = "<archive file>"`` (what ``podman
    save`` or ``docker save`` writes; a path starting with ``/``, ``./`` or ``../``, the last two
    from the map's folder, kept as an absolute path). Raises `ImageMapError` naming the file and
    the line."""
    source = Path(path)
    try:
        document = tomllib.loads(source.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ImageMapError(f"{source}: no such image map file (named by ENVSDK_IMAGE_MAP)") from None
    except OSError as exc:
        raise ImageMapError(f"{source}: cannot read the image map ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ImageMapError(f"{source}: not TOML (not UTF-8 text: byte {exc.start + 1})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ImageMapError(f"{source}: not TOML ({exc})") from None
    mapping: dict[str, str] = {}
    for key, value in document.items():
        if not isinstance(value, str):
            raise ImageMapError(
                f"{source}: {key!r}: the value must be an image name in quotes, e.g. \"{key}\" = \"registry.local/"
                f"image:tag\" (a table or a {type(value).__name__} is not one)"
            )
        try:
            name = full_name(key)
        except ValueError:
            raise ImageMapError(f"{source}: {key!r} is not an image name (as FROM writes one)") from None
        if value.startswith(("/", "./", "../")):
            archive = (source.parent / value).resolve()
            if not archive.is_file():
                raise ImageMapError(f"{source}: {key!r} = {value!r}: no such image archive ({archive})")
            mapping[name] = str(archive)
            continue
        try:
            full_name(value)
        except ValueError:
            raise ImageMapError(
                f"{source}: {key!r} = {value!r}: {value!r} is neither an image name nor an archive path "
                "(one starts with /, ./ or ../)"
            ) from None
        mapping[name] = value
    return mapping


def _env_image_map() -> tuple[dict[str, str], str | None]:
    named = os.environ.get("ENVSDK_IMAGE_MAP")
    if not named:
        return {}, None
    return load_image_map(named), named


# ---------------------------------------------------------------------------- preparing


def _lock_dir() -> Path:
    try:
        LOCK_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.access(LOCK_DIR, os.W_OK):
            return LOCK_DIR
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"envsdk-locks-{os.getuid()}"
    fallback.mkdir(parents=True, exist_ok=True, mode=0o700)
    return fallback


@contextlib.contextmanager
def _name_lock(engine: ContainerEngine, name: str) -> Iterator[None]:
    """Hold an exclusive file lock on preparing `name` in `engine`'s store, across processes
    (waiting at most `LOCK_WAIT_S` for another holder)."""
    store = getattr(engine, "store", None) or engine.kind
    key = hashlib.sha256(f"{store}\n{full_name(name)}".encode()).hexdigest()[:24]
    path = _lock_dir() / f"base-{key}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if not lock_by(fd, time.monotonic() + LOCK_WAIT_S):
            raise ImageUnavailableError(
                f"FROM {name}: another process has been preparing it for over {LOCK_WAIT_S:g} s (lock {path})"
            )
        yield
    finally:
        os.close(fd)


def _load_base(engine: ContainerEngine, name: str, tar: Path) -> None:
    started = time.monotonic()
    try:
        engine.load_rootfs(tar, full_name(name), changes=BASE_IMAGE_CHANGES.get(tar.name, ()))
    except ContainerError as exc:
        raise ImageUnavailableError(f"FROM {name}: loading {tar} failed: {exc}") from None
    logger.info("base image %s loaded from %s in %.1f s", full_name(name), tar, time.monotonic() - started)


def _load_archive(engine: ContainerEngine, name: str, archive: Path, source: str) -> str:
    """Load image archive `archive` (``save``'s output) into the store; the image it held."""
    try:
        # Absolute: the engine runs in a folder of its own.
        result = engine.call(["load", "-i", str(Path(archive).absolute())], timeout=600)
    except ContainerError as exc:
        raise ImageUnavailableError(f"FROM {name}: loading {archive} (named by {source}) failed: {exc}") from None
    loaded = re.search(rb"^Loaded image(?:\(s\))?(?: ID)?: *([^,\s]+)", result.stdout, re.MULTILINE)
    if loaded is None:
        raise ImageUnavailableError(f"FROM {name}: {archive} (named by {source}) held no image {engine.kind} could load")
    logger.info("image archive %s loaded for FROM %s", archive, name)
    return loaded.group(1).decode()


def _pull(engine: ContainerEngine, name: str, target: str, source: str) -> None:
    try:
        engine.call(["pull", target], timeout=600)
    except ContainerError as exc:
        raise ImageUnavailableError(f"FROM {name}: pulling {target} (named by {source}) failed: {exc}") from None


def _missing_base_line(name: str, tar: Path) -> str:
    return (
        f"FROM {name}: not in the container store, and its root filesystem {tar} is missing: "
        f"{SETUP_HINT}, or {MAP_HINT.format(name=name)}"
    )


def prepare_base(
    engine: ContainerEngine, names: Iterable[str], *, image_map: Mapping[str, str] | None = None,
    pull: bool | None = None, bases: Mapping[str, str] | None = None, base_dir: Path | None = None,
) -> dict[str, str]:
    """Make every image in `names` (``FROM`` names, as `from_names` gives them) available in
    `engine`'s store for an offline build (see the module docstring for the order of ways).
    `image_map`: FROM name -> local image (default: the file named by ``ENVSDK_IMAGE_MAP``, if
    any); `pull`: leave what cannot be had here to the engine's pull (default `pull_allowed`);
    `bases` and `base_dir`: the base images and where their tarballs are (default `BASE_IMAGES`
    and `base_image_dir`). Returns how each name was had: ``"in store"``, ``"mapped from
    <image>"``, ``"loaded from <tar>"`` or ``"left to pull"``. Raises `ImageUnavailableError`
    (one line, naming the FROM and what to do) and `ImageMapError`."""
    map_file: str | None = None
    if image_map is None:
        image_map, map_file = _env_image_map()
    mapped = {full_name(key): value for key, value in image_map.items()}
    known = _BASES_BY_FULL_NAME if bases is None else {full_name(key): file for key, file in bases.items()}
    folder = base_image_dir() if base_dir is None else Path(base_dir)
    may_pull = pull_allowed() if pull is None else pull
    done: dict[str, str] = {}
    for name in names:
        if name in done:
            continue
        try:
            canonical = full_name(name)
        except ValueError:
            raise ImageUnavailableError(f"FROM {name}: not an image name") from None
        if engine.image_exists(name):
            done[name] = "in store"
            continue
        with _name_lock(engine, name):
            if engine.image_exists(name):  # made by another process while this one waited
                done[name] = "in store"
            elif canonical in mapped:
                target = mapped[canonical]
                source = f"the image map {map_file}" if map_file else "the image map"
                if target.startswith("/"):
                    target = _load_archive(engine, name, Path(target), source)
                elif not engine.image_exists(target):
                    target_file = known.get(full_name(target))
                    if target_file is not None:
                        tar = folder / target_file
                        if not tar.is_file():
                            raise ImageUnavailableError(_missing_base_line(target, tar))
                        _load_base(engine, target, tar)
                        target = full_name(target)
                    elif may_pull:
                        _pull(engine, name, target, source)
                    else:
                        raise ImageUnavailableError(
                            f"FROM {name}: {source} maps it to {target}, which is not in the container store: "
                            f"map {name} to an image archive file instead (written by `{engine.kind} save -o FILE "
                            f"{target}`), or allow pulls with ENVSDK_PULL=1 where {target}'s registry is reachable"
                        )
                try:
                    engine.tag(target, canonical)
                except ContainerError as exc:
                    raise ImageUnavailableError(f"FROM {name}: tagging {target} as {canonical} failed: {exc}") from None
                done[name] = f"mapped from {target}"
            elif may_pull:
                done[name] = "left to pull"
            elif canonical in known:
                tar = folder / known[canonical]
                if not tar.is_file():
                    raise ImageUnavailableError(_missing_base_line(name, tar))
                _load_base(engine, name, tar)
                done[name] = f"loaded from {tar}"
            else:
                if "@" in name:
                    raise ImageUnavailableError(
                        f"FROM {name}: pinned by digest and not in the container store: load that very image into the "
                        f"store ({engine.kind} load), or write the FROM without a digest and {MAP_HINT.format(name=name.split('@')[0])}"
                    )
                bases_named = ", ".join(sorted(BASE_IMAGES)) if bases is None else ", ".join(sorted(bases))
                raise ImageUnavailableError(
                    f"FROM {name}: not in the container store and no registry is used (builds are offline): "
                    f"{MAP_HINT.format(name=name)}, or start from a base image built here ({bases_named}; "
                    f"{SETUP_HINT}), or allow pulls with ENVSDK_PULL=1 where a registry is reachable"
                )
    return done
