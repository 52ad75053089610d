"""The verifier's tamper check: did the agent change what the verification runs?

A task's tests run in the agent's container (Harbor's design), with the programs, libraries and
Python start-up files found there, and the agent was root in it. So before they run, the
verifier asks the container engine what the agent changed relative to the image
(`ContainerSandbox.changes`: read by the engine from its storage on the host, with every
process of the container stopped, so that nothing can change or hide a file afterwards), and
when a change touches what the verification depends on the tests are not run: the episode
scores 0.0 and the paths are named.

First the changes are measured where the engine keeps them on this host (an overlay's upper
layer: `measure_changes`, within `CHANGE_BUDGET`): the engine's list grows costly with the
number of entries and far more with their depth, and podman holds its store's lock (which
every container start on the machine waits for) while it makes it. Past the budget, or past
`CHANGES_BYTES` of list, the tests are not run (`TOO_MANY_CHANGES`, or the folder nested too
deep, named); the check running out of time because of the agent's files scores 0.0 the same
way, while an engine that fails on its own stays an error.

Then the check looks twice:

1. `first_look`, from the engine's list and the image's own links (`ImageLinks`, listed
   once per image in a fresh container of it), before anything in the container runs again:
   anything in the system folders (`SYSTEM_FOLDERS`: programs, libraries, the dynamic
   loader, Debian's Python), the loader's settings (`LOADER_FILES`), Debian's alternatives
   (`ALTERNATIVES`), Perl's and npm's own modules (`LIBRARY_FOLDERS`), what a protected link
   leads to wherever it lies (``/usr/bin/awk -> /etc/alternatives/awk``,
   ``/usr/bin/py3versions -> ../share/python3/py3versions.py``: the links and folders on the
   way, the file it names), Python start-up modules (``sitecustomize``,
   ``usercustomize``: anywhere), a user site (``~/.local/lib/python*``), pytest's settings
   at ``/``, a shared library of the image's in /usr/local/lib; of each Python
   installation (/usr/local, and a virtual environment whose ``bin`` is on the PATH): its
   standard library and ``pyvenv.cfg``, ``.pth`` files in its package folders, a package
   it installed changed or added into, byte code written for one; whatever the
   container's environment names (``LD_LIBRARY_PATH`` and ``PYTHONHOME`` folders, the
   files of ``LD_PRELOAD``, ``BASH_ENV``, ``ENV``, ``PYTHONSTARTUP``); in the ``PATH``
   folders outside the system folders, a program named like one the container runs when
   it starts (`START_PROGRAMS`) or an interpreter (`INTERPRETERS`); and a protected
   folder, or one above it, replaced (by a link) or changed with nothing in it changed.
   When this look finds nothing, starting the container again runs only the image's own
   bash, coreutils and libraries.
2. `second_look_script` then runs in that shell (builtins, /usr/bin/stat, ls, find and head
   only), always, and `second_look` reads its answer: a program added or changed in a ``PATH`` folder whose
   name the image has in a later ``PATH`` folder (it shadows it); a Python module added at
   the top of a package folder or a ``PYTHONPATH`` folder whose name the image has in
   another Python folder; an added package whose ``entry_points.txt`` declares a pytest
   plugin (pytest loads those on its own); a folder on the way of a protected link that
   changed and is now not a folder; ``/``, a protected folder or one above a protected path
   (``/etc``, ``/usr``, ``/var/lib``...) that changed and is now not a folder, writable by
   users other than root (the sticky bit does not help: new names matter there), not owned
   by root, or with a POSIX ACL (``ls``'s ``+``): a test that runs the agent's code as
   ``nobody`` would let it rename or plant what the verification runs; an account other than
   root with uid 0 in a changed ``/etc/passwd`` (``setpriv --reuid=nobody`` would run the
   agent's code as root); and a symbolic link of the agent's (not the image's, or pointing
   elsewhere) that leads, resolved as the kernel does with every link of the container
   (chains, relative and absolute, through the image's links and the agent's), into
   ``/tests`` or ``/logs`` (`VERIFIER_FOLDERS`: they hold nothing yet, so such a link
   dangles while the agent works, then hands the tests their own expected file as the
   agent's output) or through a process's own links (``/proc/self/root``, ``/dev/fd``):
   `links_out_of_bounds`.

New names shadow nothing and stay allowed: a program of the agent's own in /usr/local/bin,
a Python module of its own, an image's program in /usr/local/bin that no system program
shares a name with, changed (a task may ask to fix such a script), a virtual environment of
its own that the tests' PATH does not name. What the check cannot see: what the tests read
as data (the agent's work, as in Harbor), the working folder, which comes first on
``sys.path`` for ``python -m`` and ``python -c``, files read by login shells or PAM,
settings in /etc that a program reads and that can run code (``/etc/gitconfig``), what a
folder a protected link names holds.
"""

from __future__ import annotations

import collections
import fnmatch
import json
import os
import posixpath
import re
import secrets
import shlex
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from envsdk.sandbox import SandboxPathError
from envsdk.sandbox.container import (
    CHANGES_BYTES,
    ENGINE_CALL_S,
    EXEC_DIR,
    ContainerError,
    ContainerSandbox,
    EngineOutputTooLarge,
)

__all__ = [
    "ALTERNATIVES",
    "DATA_LINKS",
    "INTERPRETERS",
    "LIBRARY_FOLDERS",
    "LOADER_FILES",
    "PYTEST_ROOT_FILES",
    "START_PROGRAMS",
    "SYSTEM_FOLDERS",
    "VERIFIER_FOLDERS",
    "ChangeBudget",
    "FirstLook",
    "ImageLinks",
    "Surface",
    "check",
    "container_env",
    "describe",
    "first_look",
    "image_links",
    "links_out_of_bounds",
    "measure_changes",
    "protected_by",
    "second_look",
    "second_look_script",
]

#: Folders whose every entry belongs to the image's system (the folder itself and anything in
#: it, added, changed or deleted): programs, libraries and the dynamic loader, Debian's Python
#: (/usr/lib/python3*). On merged-usr systems /bin, /sbin and /lib* are links into /usr: the
#: engine lists the real path of what changed behind them, and the link itself if it changed.
SYSTEM_FOLDERS = (
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libx32", "/usr/libexec",
)
#: The dynamic loader's settings: a library named in ld.so.preload is loaded into every
#: program; ld.so.conf(.d) and the cache say where libraries are found. (/etc/bash.bashrc is
#: not here: a bash that is not interactive does not read it.)
LOADER_FILES = ("/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.cache")
#: Debian's alternatives: /usr/bin/awk, which, pager, java... are links through
#: /etc/alternatives, which update-alternatives (and dpkg, which runs it) points again from its
#: records in /var/lib/dpkg/alternatives. The programs themselves follow only the links (an
#: edited record changes nothing until update-alternatives runs), but neither folder holds
#: anything an agent has a reason to change without also changing the system folders.
ALTERNATIVES = ("/etc/alternatives", "/var/lib/dpkg/alternatives")
#: What names the libraries that account lookups (``getent``, ``id``, Python's ``pwd``: the
#: name service switch) and ``su``/``runuser``/``login`` (PAM, which takes absolute module
#: paths) load into the process that asks, root in the tests.
ACCOUNT_MODULES = ("/etc/nsswitch.conf", "/etc/pam.conf", "/etc/pam.d", "/etc/security")
#: Links in the system folders that lead to data a task may well change: OpenSSL's
#: certificates and keys (``update-ca-certificates`` rewrites
#: /etc/ssl/certs/ca-certificates.crt; a server's key goes to /etc/ssl/private). What they
#: lead to is not protected (OpenSSL's settings, /usr/lib/ssl/openssl.cnf, are: they may load
#: a library).
DATA_LINKS = ("/usr/lib/ssl/cert.pem", "/usr/lib/ssl/certs", "/usr/lib/ssl/private")
#: Other interpreters' own modules outside the system folders: Perl's (Debian's @INC puts
#: /etc/perl and the /usr/local ones first), npm's (``npm test``, ``npx``), and a
#: node_modules at the root (Node looks for modules in every folder above the script: /tests's
#: only other one is /).
LIBRARY_FOLDERS = (
    "/etc/perl", "/usr/share/perl", "/usr/share/perl5", "/usr/local/share/perl", "/usr/local/lib/site_perl",
    "/usr/local/lib/x86_64-linux-gnu/perl", "/usr/local/lib/aarch64-linux-gnu/perl",
    "/usr/local/lib/node_modules/npm", "/usr/local/lib/node_modules/corepack", "/node_modules",
)
#: pytest looks for its settings (and so its rootdir and conftest.py) in the folders above the
#: tests: /tests is made fresh, / is the only one left.
PYTEST_ROOT_FILES = ("/conftest.py", "/pytest.ini", "/.pytest.ini", "/pyproject.toml", "/tox.ini", "/setup.cfg", "/setup.py")
#: Programs the container runs, looked up on its PATH, when it starts again for the tests: its
#: first process (bash) and that one's sleep, the shell the host talks to (bash) and what it
#: uses (cat, head, stat, rm, mkdir). One planted where PATH finds it first would run before
#: the second look, and could remove itself.
START_PROGRAMS = ("bash", "sh", "sleep", "cat", "head", "stat", "rm", "mkdir")
#: Interpreters and runners a test script names (shell patterns): in a PATH folder outside the
#: system folders they count even as new names (stock Python images keep python3 in /usr/local/bin).
INTERPRETERS = (
    "python", "python[0-9]*", "pip", "pip[0-9]*", "pytest", "py.test", "env", "dash",
    "perl", "perl[0-9]*", "node", "nodejs", "ruby", "uv", "uvx",
)
#: Modules Python imports when it starts, from whichever folder of its path holds them first.
PYTHON_START_MODULES = ("sitecustomize", "usercustomize")
PACKAGE_FOLDERS = ("site-packages", "dist-packages")
#: Python installations whose packages the tests' Python reads (``<prefix>/lib/python*/``),
#: beside those of a ``<prefix>/bin`` on the PATH (a virtual environment or conda).
PYTHON_PREFIXES = ("/usr", "/usr/local")
#: The PATH a container gets when its image sets none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: At most this many questions for the second look; past it their paths count as tampering.
MAX_QUESTIONS = 1024
#: Links followed in resolving one path, as the kernel allows (past it: ELOOP).
MAX_LINKS = 40
#: The most characters of link targets and of paths passed in resolving every link of the
#: agent's (about a second, a few MB): links made to cost more than that (long chains of long
#: targets, deep folders) are not judged but refused.
LINK_PARTS_BUDGET = 4_000_000
#: Filesystems of the kernel's, whose own links are not listed: going up (``..``) out of one of
#: their folders is refused.
KERNEL_FOLDERS = ("/proc", "/sys", "/dev")
#: Stands for every path when the container cannot be started again from the agent's files.
NOT_RESTARTED = "/ (the container could not be started again from the agent's files)"
#: Stands for the agent's links when resolving them would take more than `LINK_PARTS_BUDGET`.
TOO_MANY_LINKS = "/ (links too many or too long to check)"


class TooManyLinks(Exception):
    """Resolving the agent's links walked more than its budget of parts."""
#: Where the verifier puts what the tests bring and write, after this check: the tests (with the
#: expected outputs they keep) and the reward's folder. No link of the agent's may lead there: a
#: test that reads the agent's output through it would compare its expected file with itself.
VERIFIER_FOLDERS = ("/tests", "/logs")
#: The kernel's links to a process's own folders and files (``/proc/self/root`` is ``/`` as
#: the reading process sees it, ``/proc/self/fd/3`` a file it has open): a link of the agent's
#: through them leads wherever the tests look, /tests included.
_PROCESS_LINK = re.compile(r"^/proc/[^/]+/(task/[^/]+/)?(root|cwd|exe|fd|map_files)(/|$)")
#: The engine's links in /dev (a mount of its own, so not among the image's links).
DEVICE_LINKS = {
    "/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1",
    "/dev/stderr": "/proc/self/fd/2",
}

_USER_SITE = re.compile(r"/\.local/lib/python[^/]*(/|$)")
_PYTEST_PLUGIN = re.compile(r"\.(dist|egg)-info/entry_points\.txt$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHARED_LIBRARY = re.compile(r"\.so(\.|$)")


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _parents(path: str) -> Iterable[str]:
    """The folders above `path`, the root left out."""
    while path not in ("/", ""):
        path = posixpath.dirname(path)
        if path != "/":
            yield path


def _folders(value: str | None) -> tuple[str, ...]:
    """The absolute folders of a colon-separated list (others are the image's own affair)."""
    found: list[str] = []
    for part in (value or "").split(":"):
        if part.startswith("/"):
            folder = posixpath.normpath(part)
            if folder not in found:
                found.append(folder)
    return tuple(found)


@dataclass(frozen=True)
class Surface:
    """What of the container's environment the verification depends on: its PATH folders,
    the folders and files its variables name, its Python installations. From the image's
    environment and the task's ``[verifier] env``: the agent can change neither."""

    path: tuple[str, ...]
    whole_folders: tuple[str, ...] = ()
    named_files: tuple[str, ...] = ()
    python_path: tuple[str, ...] = ()

    @classmethod
    def of(cls, env: Mapping[str, str]) -> Surface:
        named = [
            posixpath.normpath(part)
            for key in ("LD_PRELOAD", "BASH_ENV", "ENV", "PYTHONSTARTUP")
            for part in re.split(r"[\s:]+", env.get(key, ""))
            if part.startswith("/")
        ]
        return cls(
            path=_folders(env.get("PATH", DEFAULT_PATH)),
            whole_folders=(*_folders(env.get("LD_LIBRARY_PATH")), *_folders(env.get("PYTHONHOME"))),
            named_files=tuple(named),
            python_path=_folders(env.get("PYTHONPATH")),
        )

    @cached_property
    def user_path(self) -> tuple[str, ...]:
        """The PATH folders outside the system folders."""
        return tuple(f for f in self.path if not any(_under(f, s) for s in SYSTEM_FOLDERS))

    @cached_property
    def protected_whole(self) -> re.Pattern[str]:
        """Matches the paths where any change is tampering, whatever it is."""
        folders = (*SYSTEM_FOLDERS, *LOADER_FILES, *ALTERNATIVES, *ACCOUNT_MODULES, *LIBRARY_FOLDERS,
                   *self.whole_folders, *self.named_files)
        return re.compile("(?:" + "|".join(re.escape(f.rstrip("/")) for f in folders) + ")(?:/|$)", re.DOTALL)

    @cached_property
    def target_holders(self) -> frozenset[str]:
        """The `targets` and every folder above one."""
        return frozenset({*self.targets, "/", *(parent for t in self.targets for parent in _parents(t))})

    @cached_property
    def prefixes(self) -> tuple[str, ...]:
        """The Python installations: `PYTHON_PREFIXES` and each ``<prefix>/bin`` of the PATH."""
        extra = [posixpath.dirname(f) for f in self.user_path if posixpath.basename(f) == "bin"]
        return tuple(dict.fromkeys((*PYTHON_PREFIXES, *(p for p in extra if p != "/"))))

    @cached_property
    def targets(self) -> tuple[str, ...]:
        """Folders that must stay what the image made them (not a link, not writable by
        others): where programs, libraries and modules are looked up, and the lib folder of
        each Python installation outside the system folders."""
        libs = [f"{p}/lib" for p in self.prefixes if not any(_under(f"{p}/lib", s) for s in SYSTEM_FOLDERS)]
        return (*self.user_path, *self.whole_folders, *self.python_path, *libs)

    def package(self, path: str) -> tuple[str, str] | None:
        """The package folder of a Python installation that `path` lies in, and its name
        there (the top-level module or file); None outside one (or for the folder itself)."""
        for prefix in self.prefixes:
            if path.startswith(f"{prefix}/lib/python"):
                parts = path[len(prefix) + 5:].split("/")
                if len(parts) >= 3 and parts[1] in PACKAGE_FOLDERS:
                    return f"{prefix}/lib/{parts[0]}/{parts[1]}", parts[2]
        return None

    def python_lib(self, path: str) -> bool:
        """Whether `path` is a Python installation's own: its standard library and what sits
        beside its package folders, its libpython, a virtual environment's settings."""
        for prefix in self.prefixes:
            if path == f"{prefix}/pyvenv.cfg" or path.startswith(f"{prefix}/lib/libpython"):
                return True
            if path.startswith(f"{prefix}/lib/python"):
                parts = path[len(prefix) + 5:].split("/")
                return len(parts) < 2 or parts[1] not in PACKAGE_FOLDERS
        return False

    def package_folder(self, path: str) -> bool:
        """Whether `path` is a package folder of a Python installation."""
        return self.python_folder(path) == 2

    def python_folder(self, path: str) -> int:
        """2 for a package folder of a Python installation, 1 for its ``lib/python*``, else 0."""
        for prefix in self.prefixes:
            if path.startswith(f"{prefix}/lib/python"):
                parts = path[len(prefix) + 5:].split("/")
                return 1 if len(parts) == 1 else 2 if len(parts) == 2 and parts[1] in PACKAGE_FOLDERS else 0
        return 0

    def module_globs(self, module: str) -> list[str]:
        """Shell globs of where the image may hold `module` (an identifier)."""
        folders = [
            f"{shlex.quote(prefix)}/lib/python3*{sub}" for prefix in self.prefixes
            for sub in ("", "/lib-dynload", "/site-packages", "/dist-packages")
        ]
        folders += [shlex.quote(f) for f in self.python_path]
        return [f"{f}/{module}{end}" for f in folders for end in ("", ".py", ".pyc", ".so", ".*.so")]


@dataclass(frozen=True)
class _Hop:
    """A path that resolving a protected link passes by. `hard`: one of the links is protected
    whatever its name (else each of `roots` is a link in a PATH folder, judged by its name);
    `folder`: a folder on the way (or one a link names), not a file or link it names."""

    hard: bool
    folder: bool
    roots: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageLinks:
    """An image's symbolic links, as `PROBE` lists them in a container of it that nobody
    changed: each link's path (its folders hold no link: find does not follow links), its
    target as written, and the type of what it finally names (find's ``%Y``: ``f``, ``d``,
    ``N`` for nothing, ``L`` for a loop...).

    A protected link (`protected_by`) leads the verification to paths the agent may write:
    ``/usr/bin/awk -> /etc/alternatives/awk -> /usr/bin/mawk``,
    ``/usr/bin/py3versions -> ../share/python3/py3versions.py``,
    ``/usr/lib/ssl/openssl.cnf -> /etc/ssl/openssl.cnf`` (which Python's hashlib reads, and
    which may load a library), ``/usr/local/bin/node -> /opt/node/bin/node``. `hops` names
    them, so that the first look protects each as much as the link: the links on the way, the
    folders on the way (not replaced), and the file the link names. What a folder a link
    names holds is not protected (a file added to /opt/jdk when /usr/lib/jvm/default links
    there is judged as anywhere else), nor what `DATA_LINKS` lead to."""

    targets: Mapping[str, str] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)
    _hops: dict[Surface, dict[str, _Hop]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, output: bytes) -> ImageLinks:
        """`PROBE`'s output read; `ValueError` when it is not the whole answer."""
        records = output.decode("utf-8", "surrogateescape").split("\0")
        if records[-2:] != ["END", ""] or (len(records) - 2) % 3:
            raise ValueError("the list of the image's links is cut short")
        fields = records[:-2]
        paths = fields[0::3]
        return cls(dict(zip(paths, fields[1::3], strict=True)), dict(zip(paths, fields[2::3], strict=True)))

    @property
    def size(self) -> int:
        """The bytes of `PROBE`'s answer that listed these links."""
        return sum(len(os.fsencode(path)) + len(os.fsencode(target)) + 4 for path, target in self.targets.items())

    def resolve(self, link: str, *, climbs: list[str] | None = None, budget: list[int] | None = None) -> list[str]:
        """The paths resolving `link` passes by after it, in order, as the kernel walks them:
        each folder and link (``..`` goes back to a folder already passed); the last is what
        it names. At most `MAX_LINKS` links are followed. `climbs`, when given, gets each
        folder a ``..`` went up from. Linear in the length of the targets (a deque of their
        parts: a target of thousands of slashes costs no more than its length). `budget`, when
        given, is a one-item list of the parts still allowed to be walked, shared by calls:
        `TooManyLinks` once it is spent."""
        passed: list[str] = []
        current = link.rpartition("/")[0]
        todo: collections.deque[str] = collections.deque()
        target: str | None = self.targets[link]
        followed = 0
        while target is not None:
            followed += 1
            if target.startswith("/"):
                current = ""
            if budget is not None:
                budget[0] -= len(target)
                if budget[0] < 0:
                    raise TooManyLinks
            parts = [part for part in target.split("/") if part not in ("", ".")]
            todo.extendleft(reversed(parts))
            target = None
            while todo and target is None:
                part = todo.popleft()
                if part == "..":
                    if climbs is not None:
                        climbs.append(current)
                    current = current.rpartition("/")[0]
                    continue
                path = f"{current}/{part}"
                passed.append(path)
                if budget is not None:
                    budget[0] -= len(path)
                    if budget[0] < 0:
                        raise TooManyLinks
                target = self.targets.get(path) if followed < MAX_LINKS else None
                if target is None:
                    current = path
        return passed

    def hops(self, surface: Surface) -> dict[str, _Hop]:
        """What the protected links lead to, outside the places protected whole (see the class
        docstring): each path and how it is protected. Worked out once per `surface`."""
        found = self._hops.get(surface)
        if found is None:
            found = self._hops[surface] = self._reached(surface)
        return found

    def _reached(self, surface: Surface) -> dict[str, _Hop]:
        found: dict[str, _Hop] = {}
        for link in self.targets:
            hard = protected_by(link, surface)
            if hard is None:
                continue
            passed = self.resolve(link)
            for index, path in enumerate(passed):
                if _whole(path, surface):
                    continue
                folder = path not in self.targets and (index < len(passed) - 1 or self.kinds.get(link) == "d")
                hop = _Hop(hard, folder, () if hard else (link,))
                known = found.get(path)
                if known is not None:
                    hop = _Hop(known.hard or hard, known.folder and folder, tuple(dict.fromkeys(known.roots + hop.roots)))
                found[path] = hop
        return found


def protected_by(link: str, surface: Surface) -> bool | None:
    """How a link of the image is protected: True when any change of it is tampering (what it
    leads to then is protected the same), False for one in a PATH folder outside the system
    folders that is judged by its name (what it leads to then counts when the name shadows a
    program further on the PATH), None when it is not protected."""
    if link in DATA_LINKS:
        return None
    if _static(link, "C", {}, surface):
        return True
    return False if posixpath.dirname(link) in surface.user_path else None


@dataclass
class FirstLook:
    """What the engine's list alone shows (`tampered`), and what the second look must ask the
    container: `shadows` (an entry, the folder it may shadow from, and the paths or globs
    whose existence in the image makes it a shadow), `plugins` (added entry_points.txt
    files), `folders` (changed protected folders, and folders above a protected path, whose
    type, owner, mode and ACLs matter; ``/`` always, which the engine never lists and which
    holds protected names), `passwd` (whether /etc/passwd changed), `kept` (changed folders
    on the way of a protected link, which must still be folders); `added`: every path the
    agent added."""

    tampered: list[str] = field(default_factory=list)
    shadows: list[tuple[str, str, list[str]]] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    passwd: bool = False
    kept: list[str] = field(default_factory=list)
    added: frozenset[str] = frozenset()

    @property
    def questions(self) -> int:
        return len(self.shadows) + len(self.plugins) + len(self.folders) + self.passwd + len(self.kept)

    @property
    def asked(self) -> list[str]:
        """The paths the questions are about."""
        return (
            [path for path, _, _ in self.shadows] + self.plugins + self.folders + ["/etc/passwd"] * self.passwd
            + self.kept
        )


def first_look(changes: Iterable[tuple[str, str]], surface: Surface, links: ImageLinks | None = None) -> FirstLook:
    """Judge the engine's list of `changes` (``(kind, path)``) against `surface` and what the
    image's protected `links` lead to (see the module docstring); what only the container can
    answer goes into the result's questions."""
    kinds = {path: kind for kind, path in changes}
    above: set[str] = set()  # every folder with something listed below it (/ left out)
    for path in kinds:
        end = path.rfind("/")
        while end > 0 and path[:end] not in above:
            above.add(path[:end])
            end = path.rfind("/", 0, end)
    look = FirstLook(added=frozenset(p for p, k in kinds.items() if k == "A"), passwd="/etc/passwd" in kinds)
    hops = links.hops(surface) if links is not None else {}
    for path, kind in sorted(kinds.items()):
        listed_below = path in above
        hop = hops.get(path)
        if hop is not None:
            if hop.folder and (kind == "C" or kind == "A" and listed_below):
                # A folder on the way that changed (/etc always does: the engine mounts files
                # there) must still be a folder; in one the agent made, with the rest of the
                # way in it, what is on the way is judged on its own.
                if kind == "C" and hop.hard:
                    look.kept.append(path)
            elif hop.hard:
                look.tampered.append(path)
                continue
            else:
                for root in hop.roots:
                    _shadow(look, path, posixpath.basename(root), posixpath.dirname(root), kinds, surface)
        guarded = path in surface.target_holders or surface.python_folder(path) > 0
        if listed_below and kind == "C":
            # A folder listed because something in it changed: that is what is judged (and,
            # for a protected folder, its type, owner and mode).
            if guarded:
                look.folders.append(path)
            continue
        if _static(path, kind, kinds, surface) or (
            # A protected folder (or one above it) replaced, e.g. by a link, or changed in its
            # owner or mode with nothing in it changed.
            guarded and not listed_below and (kind != "A" or not surface.package_folder(path))
        ):
            look.tampered.append(path)
            continue
        if guarded and kind == "A":
            look.folders.append(path)
        _questions(look, path, kind, kinds, surface)
    held = _held_folders(surface, hops)
    asked = set(look.folders)
    look.folders += [path for path, kind in sorted(kinds.items()) if kind != "D" and path in held and path not in asked]
    look.folders.append("/")
    return look


def _held_folders(surface: Surface, hops: Mapping[str, _Hop]) -> frozenset[str]:
    """Folders whose type, owner, mode and ACLs the verification depends on wherever the
    engine lists them as changed: the protected folders (a program, module or setting is
    looked up there by name), the verifier's, and every folder above a protected path (who may
    write there may rename what lies below and put another in its place). The tests may run
    the agent's code as another user (``setpriv --reuid=nobody``): with ``/`` or ``/logs``
    writable by it, or an ACL that lets it in, that code swaps ``/logs/verifier`` for its own."""
    folders = {*surface.targets, *VERIFIER_FOLDERS, *(path for path, hop in hops.items() if hop.folder)}
    protected = (
        *SYSTEM_FOLDERS, *LOADER_FILES, *ALTERNATIVES, *ACCOUNT_MODULES, *LIBRARY_FOLDERS, *PYTEST_ROOT_FILES,
        "/etc/passwd", *surface.whole_folders, *surface.named_files, *hops, *folders,
    )
    return frozenset(folders | {parent for path in protected for parent in _parents(path)})


def _whole(path: str, surface: Surface) -> bool:
    """Whether `path` lies where any change is tampering, whatever it is."""
    return surface.protected_whole.match(path) is not None


def _static(path: str, kind: str, kinds: Mapping[str, str], surface: Surface) -> bool:
    """Whether the change of `path` alone makes the verification untrustworthy."""
    name, parent = posixpath.basename(path), posixpath.dirname(path)
    if _whole(path, surface):
        return True
    if path in PYTEST_ROOT_FILES or _USER_SITE.search(path) or surface.python_lib(path):
        return True
    if name == "pyvenv.cfg" and any(parent in (folder, posixpath.dirname(folder)) for folder in surface.path):
        # Python reads it in its executable's folder and the one above: its ``home`` then
        # names the standard library every interpreter of the tests starts from.
        return True
    if any(name == m or name.startswith(m + ".") for m in PYTHON_START_MODULES):
        return True
    if kind != "A" and _SHARED_LIBRARY.search(name) and _under(path, "/usr/local/lib"):
        # A library of the image's where the loader's cache may find it (Debian's
        # ld.so.conf names /usr/local/lib): changed, every program linked to it runs it.
        return True
    package = surface.package(path)
    if package is not None:
        folder, top = package
        if name.endswith(".pth") and parent == folder:
            return True
        if top == "__pycache__":
            # Byte code of a top-level module: the agent's own module's, or tampering.
            source = name.split(".")[0]
            return path != f"{folder}/__pycache__" and kinds.get(f"{folder}/{source}.py") != "A"
        if kinds.get(f"{folder}/{top}") != "A" or kind != "A":
            # A package the image installed, changed (or something added into it).
            return True
    if parent in surface.user_path:
        return any(fnmatch.fnmatchcase(name, p) for p in (*START_PROGRAMS, *INTERPRETERS))
    return False


def _shadow(look: FirstLook, path: str, name: str, folder: str, kinds: Mapping[str, str], surface: Surface) -> None:
    """`path` counts when a program `name` in PATH folder `folder` shadows one the image has
    further on the PATH: known from the list, or asked."""
    ask: list[str] = []
    for later in surface.path[surface.path.index(folder) + 1:]:
        other = f"{later}/{name}"
        if kinds.get(other) in ("C", "D"):
            # The image has it there: the entry shadows it.
            look.tampered.append(path)
            return
        if other not in kinds:
            ask.append(shlex.quote(other))
    if ask:
        look.shadows.append((path, folder, ask))


def _questions(look: FirstLook, path: str, kind: str, kinds: Mapping[str, str], surface: Surface) -> None:
    name, parent = posixpath.basename(path), posixpath.dirname(path)
    if parent in surface.user_path:
        _shadow(look, path, name, parent, kinds, surface)
        return
    package = surface.package(path)
    if kind != "A" or (package is None and parent not in surface.python_path):
        return
    if _PYTEST_PLUGIN.search(path):
        look.plugins.append(path)
    module = name.split(".")[0]
    top = package is None or path == "/".join(package)
    if top and _MODULE.match(module) and module != "__pycache__":
        look.shadows.append((path, package[0] if package is not None else parent, surface.module_globs(module)))


def second_look_script(look: FirstLook, links_file: str | None = None, links_bytes: int = 0) -> str:
    """A bash script for the container started again (its bash and coreutils known to be the
    image's): its output answers `look`'s questions, records separated by NUL bytes.
    `links_file`: where it also writes the container's symbolic links, as `PROBE` lists an
    image's, then ``END`` (at most `links_bytes` bytes: what is cut has no ``END``)."""
    lines = ["shopt -s nullglob", "__tamper_e() { for p in \"$@\"; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then printf '%s\\0' \"$p\"; fi; done; }"]
    for index, (_, _, asked) in enumerate(look.shadows):
        lines.append(f"printf 'S{index}\\0'; __tamper_e {' '.join(asked)}")
    for index, path in enumerate(look.plugins):
        lines.append(
            # At most 64 KiB of a plain file: a pipe or an endless file planted there cannot hold it up.
            f"if [ -f {shlex.quote(path)} ]; then while IFS= read -r l; do if [[ $l == '[pytest11]'* ]]; then "
            f"printf 'P{index}\\0'; break; fi; done < <(/usr/bin/head -c 65536 -- {shlex.quote(path)}); fi"
        )
    if look.folders:
        # The folders there, then ls's mode (its 11th character a '+' for an ACL), owner and
        # group of each, in the same order (-U); names quoted so that each is one line.
        lines.append(
            "__tamper_f=(); for p in " + " ".join(shlex.quote(f) for f in look.folders)
            + "; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then __tamper_f+=(\"$p\"); fi; done; printf 'F\\0'; "
            "if ((${#__tamper_f[@]})); then printf '%s\\0' \"${__tamper_f[@]}\"; printf 'M\\0'; "
            "/usr/bin/ls -dlnU --quoting-style=c -- \"${__tamper_f[@]}\" 2>/dev/null "
            "| while read -r m _ u g _; do printf '%s %s %s\\0' \"$m\" \"$u\" \"$g\"; done; fi"
        )
    if look.kept:
        lines.append("printf 'K\\0'; /usr/bin/stat --printf '%f %u %g %n\\0' -- "
                     + " ".join(shlex.quote(f) for f in look.kept) + " 2>/dev/null")
    if look.passwd:
        lines.append(
            # Every uid but a plain number under 2^32 goes to the host to be read as glibc reads it.
            "while IFS=: read -r n _ u _; do if [ \"$n\" != root ] && ! [[ $u =~ ^[1-9][0-9]{0,8}$ ]]; then "
            "printf 'U:%s\\0' \"$u\"; fi; done 2>/dev/null < /etc/passwd"
        )
    if links_file is not None:
        # Not into the folders protected whole: they are the image's (else the first look found them changed).
        pruned = " -o ".join(f"-path {shlex.quote(folder)}" for folder in _PRUNED)
        lines.append(
            f"{{ /usr/bin/find / -xdev \\( -type d \\( {pruned} \\) -prune \\) -o -type l -printf {shlex.quote(PROBE[-1])} "
            f"2>/dev/null && printf 'END\\0'; }} | /usr/bin/head -c {links_bytes} > {shlex.quote(links_file)}"
        )
    lines.append("printf 'END\\0'")
    return "\n".join(lines) + "\n"


def reads_as_uid_zero(field: str) -> bool:
    """Whether glibc reads uid field `field` of /etc/passwd as 0 (root): it reads it with
    ``strtoul`` (leading blanks, a sign, decimal digits; a minus negates modulo 2^64) into a
    32-bit uid, so ``0``, ``00``, ``+0``, `` 0``, ``-0`` and ``4294967296`` all name root."""
    match = re.fullmatch(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)", field)
    if match is None:
        return False  # text after the number: the line is no account
    value = int(match.group(2))
    if value >= 1 << 64:
        return False  # strtoul gives its largest value
    return (-value if match.group(1) == "-" else value) % (1 << 32) == 0


def second_look(look: FirstLook, output: bytes) -> list[str]:
    """The paths `second_look_script`'s `output` shows tampered with (added to what the first
    look found). `ValueError` when the output is not the script's whole answer."""
    records = output.decode("utf-8", "surrogateescape").split("\0")
    if records[-2:] != ["END", ""]:
        raise ValueError("the second look's answer is cut short")
    tampered: list[str] = []
    current: str | None = None
    there: list[str] = []
    modes: list[str] = []
    for record in records[:-2]:
        if record.startswith("S") and record[1:].isdigit():
            current = record
            continue
        if record.startswith("P") and record[1:].isdigit():
            tampered.append(look.plugins[int(record[1:])])
        elif record.startswith("U:"):
            if reads_as_uid_zero(record[2:]) and "/etc/passwd" not in tampered:
                tampered.append("/etc/passwd")
        elif record in ("F", "K", "M"):
            current = record
        elif current == "F":
            there.append(record)
        elif current == "M":
            modes.append(record)
        elif current == "K":
            bits, _, _, folder = record.split(" ", 3)
            if not stat.S_ISDIR(int(bits, 16)):
                tampered.append(folder)
        elif current is not None and current.startswith("S"):
            path, folder, _ = look.shadows[int(current[1:])]
            if record not in look.added and not _under(record, folder) and path not in tampered:
                tampered.append(path)
    if len(modes) != len(there):
        raise ValueError("the second look's answer lacks the mode of a folder")
    tampered += [folder for folder, mode in zip(there, modes, strict=True) if not _held_safe(mode)]
    return tampered


def _held_safe(listed: str) -> bool:
    """Whether a folder that `ls -dln` shows as `listed` (its mode, owner and group) is one that
    only root can change: a folder owned by root, writable by no other user (its group's only
    when root's group: the sticky bit does not count, as new names matter there too), with no
    ACL (a ``+`` after the mode)."""
    mode, _, rest = listed.partition(" ")
    uid, _, gid = rest.partition(" ")
    return (
        len(mode) >= 10 and mode[0] == "d" and uid == "0" and mode[8] != "w" and (mode[5] != "w" or gid == "0")
        and mode[10:11] != "+"
    )


#: Folders the second look does not list links in: protected whole, so still the image's.
_PRUNED = (*SYSTEM_FOLDERS, *ALTERNATIVES, *LIBRARY_FOLDERS, "/etc/ld.so.conf.d", "/etc/pam.d", "/etc/security")


def links_out_of_bounds(image: ImageLinks, container: ImageLinks) -> list[str]:
    """The symbolic links of the agent's (in `container`'s list and not in `image`'s, or with
    another target) that lead into a `VERIFIER_FOLDERS` folder or through a process's links in
    /proc, resolved as the kernel does with every link of the container (the image's and the
    agent's, chains, relative and absolute; `container`'s list leaves out what `_PRUNED`
    holds, which is the image's) and the engine's in /dev."""
    kept = {link: target for link, target in image.targets.items() if any(_under(link, f) for f in _PRUNED)}
    every = ImageLinks({**DEVICE_LINKS, **kept, **container.targets})
    found: list[str] = []
    budget = [LINK_PARTS_BUDGET]
    for link, target in container.targets.items():
        if image.targets.get(link) == target:
            continue
        climbs: list[str] = []
        try:
            passed = every.resolve(link, climbs=climbs, budget=budget)
        except TooManyLinks:
            return [*found, TOO_MANY_LINKS]
        # Going up out of a folder of the kernel's (/proc, /sys, /dev): its own links there
        # (/proc/net is self/net, /sys/.../subsystem a class folder) lead elsewhere than their
        # text says, and they are not among the links listed.
        if any(_out_of_bounds(path) for path in (link, *passed)) or any(
            _under(c, folder) for c in climbs for folder in KERNEL_FOLDERS
        ):
            found.append(link)
    return found


def _out_of_bounds(path: str) -> bool:
    return any(_under(path, folder) for folder in VERIFIER_FOLDERS) or _PROCESS_LINK.match(path) is not None


# ---------------------------------------------------------------- in a container

#: Of the paths found, how many the verdict names (the server's debug log names them all).
SHOWN = 20
#: Stands for every path when the agent changed more than the check takes on (`ChangeBudget`,
#: `CHANGES_BYTES`).
TOO_MANY_CHANGES = "/ (too many changed files to check)"
#: Stands for every path when the container's list of links is longer than the check reads.
TOO_MANY_LINKS = "/ (too many symbolic links to check)"
#: Stands for every path when the look inside the container (the image's own programs only)
#: did not finish: the container's files (how many, how much of its memory they take) are the
#: agent's doing.
CHECK_CUT = "/ (the container could not answer the check: too many files, or its memory full)"


@dataclass(frozen=True)
class ChangeBudget:
    """How much change the check takes on: past any of these, measured by `measure_changes`
    before the engine is asked for its list, the tests are not run (0.0). podman's list costs
    about 30 µs an entry plus 5 to 10 µs a folder level of each entry's path (more for one long
    chain of folders), and holds the store's lock meanwhile: every other container start,
    restart and copy on the machine waits. Measured with podman 4.3 on 2 busy cores (load 5 to
    10): 100,000 files in one folder 4.5 s; 150,000 files 10 levels deep 11 s; 19,000 files
    100 deep 22 s; one chain of 1,000 folders 10.5 s, of 1,900 folders 59 s. `entries`:
    files, folders, links and deletions; `levels`: the sum of their depths below ``/``;
    `depth`: the deepest path, in folders; `seconds`: the walk's own time (it walks 150,000
    entries in 0.2 s). At these limits the list takes about 15 s on such a machine. An honest
    agent stays below: a Python virtual environment with this project's dependencies (torch
    among them) is 72,000 entries, 750,000 levels, 21 deep; 1,000 npm-like packages of 100
    files in /app/node_modules 104,000, 720,000 and 7 (its list: 8.8 s)."""

    entries: int = 200_000
    levels: int = 1_200_000
    #: The longest path, in bytes: the engine reads each under its own folder on the host, and
    #: past the system's 4,096 bytes its list fails ("file name too long").
    path_bytes: int = 3_072
    depth: int = 128
    seconds: float = 10.0


#: What `check` takes on (read when it runs).
CHANGE_BUDGET = ChangeBudget()
#: Where the second look leaves the container's list of links, on the container's exec tmpfs
#: (the engine's mount, emptied at each start; not the agent's files).
LINKS_FILE = f"{EXEC_DIR}/tamper-links"
#: What lists an image's symbolic links (`ImageLinks`): the image's own find, on its root
#: filesystem only (not /proc, /sys, or what the engine mounts).
PROBE = ("find", "/", "-xdev", "-type", "l", "-printf", "%p\\0%l\\0%Y\\0")
#: The container that runs it: nothing to write, no network, few processes.
PROBE_OPTIONS = (
    "--rm", "--network", "none", "--log-driver", "none", "--memory", "256m", "--pids-limit", "64",
    "--security-opt", "no-new-privileges",
)
#: The most of its answer read (a Debian image with Python answers about 50 KB).
PROBE_BYTES = 16 << 20
_image_env: dict[str, dict[str, str]] = {}
_image_links: dict[str, ImageLinks] = {}


def container_env(sandbox: ContainerSandbox) -> dict[str, str]:
    """The environment the container's processes start with, as the engine has it (the
    image's, fixed when the container was made: nothing inside can change it); the same for
    every container of an image, so asked once per image."""
    found = _image_env.get(sandbox.image)
    if found is None:
        listed = sandbox.engine.call(["inspect", "--format", "{{json .Config.Env}}", sandbox.id], timeout=ENGINE_CALL_S)
        found = {key: value for key, _, value in (item.partition("=") for item in json.loads(listed.stdout) or ())}
        _image_env[sandbox.image] = found
    return found


def image_links(sandbox: ContainerSandbox, *, timeout_s: float) -> ImageLinks:
    """The symbolic links of `sandbox`'s image, listed by the engine's ``run --rm`` of that
    image (a container nothing else touches, which writes nothing, so no store room is
    promised to it); the same for every container of an image, so listed once per image.
    `ContainerError` when the engine fails, the image has no GNU find, or the answer is over
    `PROBE_BYTES`."""
    found = _image_links.get(sandbox.image)
    if found is None:
        name = f"envsdk-links-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            listed = sandbox.engine.call(
                ["run", "--name", name, *PROBE_OPTIONS, "--entrypoint", PROBE[0], sandbox.image, *PROBE[1:]],
                timeout=timeout_s,
            )
        except ContainerError as exc:
            sandbox.engine.remove([name])  # a run cut at its deadline may have left it
            raise ContainerError(f"cannot list the links of image {sandbox.image}: {exc}") from None
        try:
            if len(listed.stdout) > PROBE_BYTES:
                raise ValueError(f"over {PROBE_BYTES} bytes")
            found = ImageLinks.parse(listed.stdout + b"END\0")
        except ValueError as exc:
            raise ContainerError(f"cannot list the links of image {sandbox.image}: {exc}") from None
        _image_links[sandbox.image] = found
    return found


def check(sandbox: ContainerSandbox, env: Mapping[str, str], *, timeout_s: float) -> list[str]:
    """Stop every process of `sandbox`, and list what the agent changed that the verification
    depends on (`env`: variables the tests get beside the container's own). The container is
    started again (only the image's programs running) when the first look finds nothing, and
    left stopped when it does. The paths, a folder standing for what it holds; [] when none.

    Where the engine keeps the container's changes in a folder of this host (podman's and
    Docker's overlay drivers), they are measured there first against `CHANGE_BUDGET`
    (`measure_changes`): past it, or past `CHANGES_BYTES` of the engine's list, the paths are
    `TOO_MANY_CHANGES`; so is an engine's list that takes longer than `timeout_s` where
    nothing could measure them first. Then the first look, and (the container started again)
    the second, which also lists the container's symbolic links: the agent's that lead where
    the verifier brings the tests (`links_out_of_bounds`) are named. `ContainerError` when the
    engine or the image's list of links fails."""
    links = image_links(sandbox, timeout_s=timeout_s)
    surface = Surface.of({**container_env(sandbox), **env})
    upper = _upper_folder(sandbox, timeout_s)
    # Stopped first (every process killed, none started; its kept shell goes with them), so
    # that nothing changes its files once they are measured and listed.
    sandbox.engine.call(["stop", "-t", "0", sandbox.id], timeout=timeout_s)
    if upper is not None:
        try:
            over = measure_changes(upper, CHANGE_BUDGET, max_bytes=CHANGES_BYTES)
        except OSError:
            upper = None
        else:
            if over is not None:
                return [over]
            # The engine reads the accounts to start the container again: one made a folder or a
            # FIFO makes that fail or hang, the agent's doing.
            odd = [f"/{name}" for name in ACCOUNT_FILES if not _plain_or_absent(os.path.join(upper, name))]
            if odd:
                return [f"{path} (not a plain file)" for path in odd]
    started = time.monotonic()
    try:
        changes = sandbox.changes(timeout=timeout_s, max_bytes=CHANGES_BYTES)
    except EngineOutputTooLarge:
        # What cannot be listed cannot be judged: the agent changed too many files to check.
        return [TOO_MANY_CHANGES]
    except ContainerError:
        if upper is None and time.monotonic() - started >= timeout_s:
            # Nothing measured the changes first: a list that takes this long is the agent's many files.
            return [TOO_MANY_CHANGES]
        raise
    look = first_look(changes, surface, links)
    if look.tampered:
        return _leaves(look.tampered)
    try:
        sandbox.stop_processes()
    except ContainerError:
        # Started again from the agent's files (its working folder, its accounts, ...): a start
        # that fails now is the agent's doing, whatever it broke, and nothing can be checked.
        return [NOT_RESTARTED]
    if look.questions > MAX_QUESTIONS:
        return _leaves(look.asked)
    # As much as read_file takes, which must hold the image's own links at least.
    limit = min(PROBE_BYTES, 16 * sandbox.limits.output_bytes - 1)
    if links.size > limit:
        raise ContainerError(
            f"the links of image {sandbox.image} ({links.size} bytes) are more than a container with output_bytes "
            f"{sandbox.limits.output_bytes} can list for the check: raise output_bytes to {links.size // 16 + 1} at least"
        )
    run = sandbox.bash(second_look_script(look, LINKS_FILE, limit + 1), timeout=timeout_s)
    try:
        listed = sandbox.read_file(LINKS_FILE, max_bytes=limit + 1)
    except SandboxPathError:
        listed = b""  # not written: the script did not get that far
    sandbox.bash(f"rm -f {LINKS_FILE}", timeout=timeout_s)
    try:
        tampered = second_look(look, run.stdout)
        if len(listed) > limit:
            tampered.append(TOO_MANY_LINKS)
        else:
            tampered += links_out_of_bounds(links, ImageLinks.parse(listed))
    except ValueError:
        # Only the image's own programs ran: the agent's files made them fail.
        return [CHECK_CUT]
    return _leaves(tampered)


def _upper_folder(sandbox: ContainerSandbox, timeout_s: float) -> str | None:
    """The host folder where the engine keeps what was written in `sandbox` (an overlay's upper
    layer), or None where there is none that this process can read (vfs, a remote daemon)."""
    found = sandbox.engine.call(
        ["inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", sandbox.id], timeout=timeout_s, check=False,
    )
    folder = os.fsdecode(found.stdout.strip())
    return folder if found.returncode == 0 and folder.startswith("/") and os.path.isdir(folder) else None


#: The files the engine reads in the container to start it (users and groups).
ACCOUNT_FILES = ("etc/passwd", "etc/group")


def _plain_or_absent(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True


def _top(path: bytes) -> str:
    """The first two levels of container path `path` (``/root/a`` of ``/root/a/b/c``): what a
    refusal names."""
    return "/".join(os.fsdecode(path).split("/")[:3])


def measure_changes(folder: str, budget: ChangeBudget, *, max_bytes: int = CHANGES_BYTES) -> str | None:
    """Walk `folder`, a container's upper layer (what was added, changed or deleted in it, kept
    by the engine on the host), no further than `budget` and `max_bytes` of paths (the size of
    the engine's list): None when the changes are within them, else what stands for them in
    the verdict (`TOO_MANY_CHANGES`, or the first two folders of a path nested too deep).
    `OSError` when `folder` cannot be read."""
    started = time.monotonic()
    entries = levels = size = 0
    todo: list[tuple[bytes, bytes, int]] = [(os.fsencode(folder), b"", 0)]
    while todo:
        real, shown, depth = todo.pop()
        with os.scandir(real) as listing:
            for entry in listing:
                path = shown + b"/" + entry.name
                entries += 1
                levels += depth + 1
                size += len(path) + 4  # quoted and separated in the engine's list
                if len(path) > budget.path_bytes:
                    return f"{_top(path)} (a path longer than {budget.path_bytes} bytes: too long to check)"
                if depth + 1 > budget.depth:
                    return f"{_top(path)} (folders nested more than {budget.depth} deep: too deep to check)"
                if entries > budget.entries or levels > budget.levels or size > max_bytes:
                    return TOO_MANY_CHANGES
                if entries % 4096 == 0 and time.monotonic() - started > budget.seconds:
                    return TOO_MANY_CHANGES
                if entry.is_dir(follow_symlinks=False):
                    todo.append((os.fsencode(entry.path), path, depth + 1))
    return None


def _leaves(paths: Iterable[str]) -> list[str]:
    """`paths` sorted, without those that hold another of them (the deepest say what changed)."""
    unique = set(paths)
    holding = {parent for path in unique for parent in _parents(path)}
    return sorted(unique - holding)


def describe(paths: Sequence[str]) -> str:
    """One line saying why the tests were not run."""
    shown = ", ".join(p if p.isprintable() else ascii(p) for p in paths[:3])
    more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
    return f"the tests were not run: the agent changed what the verification runs: {shown}{more}"
