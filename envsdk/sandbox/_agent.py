# mypy: ignore-errors
# (This file is not imported: it is the -c source of the sandbox's own interpreter, which has
# no envsdk and may be another Python version; it keeps to the plain standard library.)
"""The agent: the one process a sandbox starts, run inside it by every provider.

The host sends one JSON line per request on the agent's stdin and reads one JSON line back on
its stdout. The agent runs each command as its own child (own session, the sandbox's rlimits),
keeps one persistent Python interpreter (the REPL worker) for snippets, and after every request
kills whatever the request left running. It is a child subreaper, so a daemonised grandchild
that outlives its parent is re-parented to the agent and still found and killed.

This file is sent to the sandbox's interpreter as ``-c`` source: it must import nothing but the
standard library and must not be imported by envsdk itself (`envsdk.sandbox.base` reads it as
text). Bytes travel base64-encoded.
"""

import base64
import ctypes
import json
import os
import resource
import selectors
import signal
import subprocess
import sys
import time

LIMITS = json.loads(sys.argv[1])
WORKSPACE = os.getcwd()
PR_SET_CHILD_SUBREAPER = 36
PR_SET_DUMPABLE = 4
WORKER_PIDS = set
#: A run that writes more than this many times ``output_bytes`` to one stream is killed:
#: reading and dropping gigabytes would cost the machine CPU for nothing.
OUTPUT_KILL_FACTOR = 16

WORKER = r'''
import os, sys, traceback
control = os.fdopen(int(sys.argv[1]), "w")
source = os.fdopen(int(sys.argv[2]), "rb")
scope = {"__name__": "__main__", "__builtins__": __builtins__}
while True:
    header = source.readline()
    if not header:
        break
    code = source.read(int(header)).decode("utf-8", "replace")
    status = 0
    try:
        exec(compile(code, "<cell>", "exec"), scope)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    control.write(str(status) + "\n")
    control.flush()
'''


#: The persistent interpreter's CPU hard limit, in runs' worth: each snippet gets a soft
#: limit of its own (`Worker.execute`), which only a hard limit above it allows.
WORKER_CPU_RUNS = 60


def _limit_child(cpu_hard=None):
    """preexec_fn of every child: the sandbox's rlimits, lower priority."""
    pairs = (
        (resource.RLIMIT_CPU, (LIMITS["cpu_s"], cpu_hard or LIMITS["cpu_s"])),
        (resource.RLIMIT_AS, (LIMITS["memory_bytes"],) * 2),
        (resource.RLIMIT_NPROC, (LIMITS["processes"],) * 2),
        (resource.RLIMIT_FSIZE, (LIMITS["file_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (LIMITS["open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    )
    for which, soft_hard in pairs:
        resource.setrlimit(which, soft_hard)
    os.nice(10)


def _first_for_oom_killer(pid):
    """When the sandbox's memory cgroup is full, the kernel's OOM killer takes this process
    (a run's, the interpreter) before the agent that answers for the sandbox. Set from here
    once it runs (a preexec_fn cannot: a child of this non-dumpable agent may not write its
    own /proc files before its exec)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


# The /proc walk here and in `_descendants` repeats `envsdk.sandbox.base.process_tree` on
# purpose: this file runs alone in the sandbox's interpreter and cannot import envsdk.
def _children_map():
    """Each pid's children, and which pids are zombies."""
    children, zombies = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(b")") + 2:].split()[:2]
        children.setdefault(int(ppid), []).append(int(name))
        if state == b"Z":
            zombies.add(int(name))
    return children, zombies


def _descendants(root, keep):
    """Every descendant of `root` but the `keep` pids themselves (theirs are included), and
    the set of zombies."""
    tree, zombies = _children_map()
    found, todo = [], list(tree.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in keep:
            found.append(pid)
        todo.extend(tree.get(pid, []))
    return found, zombies


def kill_leftovers(keep=()):
    """SIGSTOP then SIGKILL every descendant of the agent but the `keep` processes themselves
    (what they started is a leftover too), until none is left: stopped processes cannot fork
    while the rest are being killed. Zombies are reaped where they are the agent's own; the
    others are dead already (a frozen interpreter's, reaped when it goes)."""
    keep = set(keep)
    for _ in range(100):
        pids, zombies = _descendants(os.getpid(), keep)
        for pid in zombies.intersection(pids):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        living = [pid for pid in pids if pid not in zombies]
        if not living:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in living:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.01)


class Capture:
    """Reads a child's stdout and stderr, keeping at most ``output_bytes`` of each and
    draining (and counting) the rest so the child never blocks on a full pipe."""

    def __init__(self, streams):
        self.limit = LIMITS["output_bytes"]
        self.kept = {name: bytearray() for name in streams}
        self.seen = {name: 0 for name in streams}
        self.selector = selectors.DefaultSelector()
        self.exceeded = False
        for name, stream in streams.items():
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream.fileno(), selectors.EVENT_READ, name)

    def streams_open(self):
        return any(key.data in self.kept for key in self.selector.get_map().values())

    def read(self, key):
        try:
            data = os.read(key.fd, 65536)
        except BlockingIOError:
            return
        if not data:
            self.selector.unregister(key.fd)
            return
        self.seen[key.data] += len(data)
        if self.seen[key.data] > self.limit * OUTPUT_KILL_FACTOR:
            self.exceeded = True
        room = self.limit - len(self.kept[key.data])
        if room > 0:
            self.kept[key.data] += data[:room]

    def pump(self, timeout):
        for key, _ in self.selector.select(timeout):
            self.read(key)

    def drain(self):
        """Read what is already in the pipes (a stream stays open while a process holds it)."""
        while True:
            ready = [key for key, _ in self.selector.select(0) if key.data in self.kept]
            if not ready:
                return
            for key in ready:
                self.read(key)

    def result(self):
        return {
            "stdout": base64.b64encode(bytes(self.kept["stdout"])).decode(),
            "stderr": base64.b64encode(bytes(self.kept["stderr"])).decode(),
            "stdout_bytes": self.seen["stdout"],
            "stderr_bytes": self.seen["stderr"],
        }


OUTPUT_NOTE = "output limit exceeded: the run was killed"


def run(request):
    started = time.monotonic()
    deadline = started + request["timeout_s"]
    data = base64.b64decode(request.get("input") or "")
    try:
        child = subprocess.Popen(
            request["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=WORKSPACE, start_new_session=True, preexec_fn=_limit_child,
        )
        _first_for_oom_killer(child.pid)
    except OSError as exc:
        # As a shell answers a command it cannot run: status 127 and the reason on stderr.
        message = f"cannot run {request['argv'][:1]}: {exc}\n".encode()
        return {"stdout": "", "stderr": base64.b64encode(message).decode(), "stdout_bytes": 0,
                "stderr_bytes": len(message), "returncode": 127, "timed_out": False, "restarted": False,
                "note": "", "duration_s": time.monotonic() - started}
    capture = Capture({"stdout": child.stdout, "stderr": child.stderr})
    try:
        child.stdin.write(data)
    except (BrokenPipeError, OSError):
        pass
    try:
        child.stdin.close()
    except OSError:
        pass
    timed_out = False
    while child.poll() is None and not capture.exceeded:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if capture.streams_open():
            capture.pump(min(left, 0.1))
        else:
            time.sleep(min(left, 0.01))
    # Whatever the command left running (a daemon holding its pipes open) dies with it.
    kill_leftovers(keep=WORKER_PIDS())
    returncode = child.wait()
    capture.drain()
    for stream in (child.stdout, child.stderr):
        stream.close()
    killed = timed_out or capture.exceeded
    return {**capture.result(), "returncode": -signal.SIGKILL if killed else returncode,
            "timed_out": timed_out, "restarted": False, "note": OUTPUT_NOTE if capture.exceeded else "",
            "duration_s": time.monotonic() - started}


class Worker:
    """The persistent interpreter: one child process per sandbox, restarted when it dies.

    Between snippets it is frozen (SIGSTOP, which cannot be caught or ignored): no code of it
    runs once its snippet is answered, whatever timer, signal handler or forged "done" line
    the snippet left; it gets CPU again only inside the next snippet's own deadline and CPU
    budget. What a snippet started is killed when it is answered. Its names stay.
    """

    def __init__(self):
        self.process = None
        self.control = None
        self.code = None

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def start(self):
        # Snippets arrive on a pipe of their own and the interpreter's stdin is /dev/null: code
        # that reads stdin gets EOF instead of the next snippets.
        read_fd, write_fd = os.pipe()
        code_read, code_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-u", "-c", WORKER, str(write_fd), str(code_read)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=WORKSPACE,
            start_new_session=True, preexec_fn=lambda: _limit_child(LIMITS["cpu_s"] * WORKER_CPU_RUNS),
            pass_fds=(write_fd, code_read),
        )
        _first_for_oom_killer(self.process.pid)
        os.close(write_fd)
        os.close(code_read)
        self.control = read_fd
        self.code = os.fdopen(code_write, "wb")

    def freeze(self):
        """Stop the interpreter and its process group until `thaw`."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self):
        self._signal_group(signal.SIGCONT)

    def _signal_group(self, sig):
        if self.process is not None:
            try:
                os.killpg(self.process.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _spoke_out_of_turn(self):
        """Whether the control pipe holds something before a snippet was sent: a line the last
        snippet wrote there itself, which would answer the next one before it ran."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.control, selectors.EVENT_READ)
            return bool(selector.select(0))

    def stop(self):
        """Kill the interpreter and everything it started; returns its exit status."""
        if self.process is None:
            return None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        returncode = self.process.wait()
        kill_leftovers()
        for stream in (self.code, self.process.stdout, self.process.stderr):
            stream.close()
        os.close(self.control)
        self.process = self.control = self.code = None
        return returncode

    def _stat(self, name):
        with open(f"/proc/{self.process.pid}/{name}", "rb") as f:
            return f.read()

    def execute(self, request):
        started = time.monotonic()
        deadline = started + request["timeout_s"]
        restarted = not self.alive() or self._spoke_out_of_turn()
        if restarted:
            self.stop()
            self.start()
        # RLIMIT_CPU counts a process's whole life: each cell gets its own budget on top of
        # what the interpreter has used so far.
        fields = self._stat("stat").rsplit(b")", 1)[1].split()
        used = (int(fields[11]) + int(fields[12])) // os.sysconf("SC_CLK_TCK")
        hard = LIMITS["cpu_s"] * WORKER_CPU_RUNS
        budget = min(used + LIMITS["cpu_s"], hard)
        resource.prlimit(self.process.pid, resource.RLIMIT_CPU, (budget, hard))
        code = request["code"].encode()
        capture = Capture({"stdout": self.process.stdout, "stderr": self.process.stderr})
        capture.selector.register(self.control, selectors.EVENT_READ, "control")
        self.thaw()
        try:
            self.code.write(b"%d\n" % len(code) + code)
            self.code.flush()
        except OSError:
            pass
        status, line, timed_out, note = None, b"", False, ""
        while status is None and not capture.exceeded:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in capture.selector.select(min(left, 0.5)):
                if key.data != "control":
                    capture.read(key)
                    continue
                chunk = os.read(self.control, 64)
                line += chunk
                if not chunk:
                    status = "died"
                elif line.endswith(b"\n"):
                    status = _status(line)
        # At once: from here on nothing the snippet set up runs, and its output is final.
        self.freeze()
        capture.selector.unregister(self.control)
        if status is not None:
            kill_leftovers(keep={self.process.pid})
            capture.drain()
        if status is None or status == "died":
            returncode = self.stop()
            returncode = -signal.SIGKILL if timed_out or capture.exceeded else returncode
            note = (OUTPUT_NOTE + "; " if capture.exceeded else "") + "the interpreter was restarted: its state is lost"
        else:
            returncode = status
            if int(self._stat("status").split(b"Threads:")[1].split()[0]) > 1:
                self.stop()
                note = "threads outlived the snippet: the interpreter was restarted, its state is lost"
        return {**capture.result(), "returncode": returncode, "timed_out": timed_out,
                "restarted": restarted, "note": note, "duration_s": time.monotonic() - started}


def _status(line):
    """A snippet's exit status from the worker loop's one line on the control pipe; anything
    but one integer was written by the snippet itself, which counts as the interpreter dying
    (it is restarted)."""
    try:
        return int(line)
    except ValueError:
        return "died"


def _workspace_path(relative):
    path = os.path.realpath(os.path.join(WORKSPACE, relative))
    if os.path.commonpath([path, WORKSPACE]) != WORKSPACE or path == WORKSPACE:
        raise ValueError(f"{relative!r} is not a file path inside the workspace")
    return path


def write_file(request):
    path = _workspace_path(request["path"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(request["data"]))
    return {"ok": True}


def read_file(request):
    path = _workspace_path(request["path"])
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read(request["max_bytes"] + 1)
    return {"data": base64.b64encode(data[: request["max_bytes"]]).decode(),
            "truncated": len(data) > request["max_bytes"]}


class Forked:
    """A fresh copy of this agent, forked, that runs Python `source` as its main module: the
    cost of a fork instead of an interpreter's start-up. Before the source runs, the copy
    drops everything of the agent's that matters (its channel to the host, the interpreter's
    pipes: every descriptor but the three new pipes) and takes a run's limits, in its own
    session. What stays is the agent's imported modules, which hold nothing secret.

    Quacks like the `subprocess.Popen` the `Served` process otherwise is."""

    #: Compiled sources by text (a few: callers send the same harness every time).
    compiled = {}

    def __init__(self, source, cpu_s=None):
        code = self.compiled.get(source)
        if code is None:
            if len(self.compiled) >= 4:
                self.compiled.clear()
            code = self.compiled[source] = compile(source, "<spawned>", "exec")
        child_in, self_in = os.pipe()
        self_out, child_out = os.pipe()
        self_err, child_err = os.pipe()
        self.returncode = None
        self.pid = os.fork()
        if self.pid == 0:
            status = 1
            try:
                os.setsid()
                for fd, target in ((child_in, 0), (child_out, 1), (child_err, 2)):
                    os.dup2(fd, target)
                os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
                _limit_child()
                # Dumpable again (it inherited the agent's refusal), so that it may put itself
                # first for the OOM killer, as every run and the interpreter are.
                ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
                _first_for_oom_killer("self")
                if cpu_s is not None:
                    # A budget of its own, below the run's: SIGXCPU at the soft limit.
                    soft = max(1, min(int(cpu_s), LIMITS["cpu_s"]))
                    resource.setrlimit(resource.RLIMIT_CPU, (soft, LIMITS["cpu_s"]))
                module = type(sys)("__main__")
                sys.modules["__main__"] = module
                exec(code, module.__dict__)
                status = 0
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        for fd in (child_in, child_out, child_err):
            os.close(fd)
        self.stdin, self.stdout, self.stderr = os.fdopen(self_in, "wb"), os.fdopen(self_out, "rb"), os.fdopen(self_err, "rb")

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by the agent's sweep: its status is gone
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self):
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = 0
        return self.returncode


class Served:
    """A process the host talks to line by line (`spawn`, `exchange`, `finish`): one at a time.

    Its stdin and stdout are the channel (one line in, one line out); its stderr is drained
    and kept up to ``output_bytes``. It runs with a run's limits, in its own session, and dies
    with whatever it started at `finish`, at the next `spawn`, or when it breaks the channel
    (EOF, a line over ``output_bytes``, no answer in time)."""

    def __init__(self):
        self.child = None
        self.started = 0.0
        self.buffer = b""
        self.capture = None
        self.ended = ""

    def spawn(self, request):
        self.finish({})
        self.started = time.monotonic()
        self.buffer, self.ended = b"", ""
        if "python" in request:
            self.child = Forked(request["python"], request.get("cpu_s"))
        else:
            self.child = subprocess.Popen(
                request["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=WORKSPACE, start_new_session=True, preexec_fn=_limit_child,
            )
        os.set_blocking(self.child.stdin.fileno(), False)
        os.set_blocking(self.child.stdout.fileno(), False)
        # Only stderr is captured (bounded); stdout is the channel, read below.
        self.capture = Capture({"stderr": self.child.stderr})
        return {"pid": self.child.pid}

    def exchange(self, request):
        if self.child is None or self.ended:
            return {"status": "closed", "detail": self.ended or "no process was started"}
        deadline = time.monotonic() + request["timeout_s"]
        out = base64.b64decode(request["data"]) + b"\n"
        selector = self.capture.selector
        stdin_fd, stdout_fd = self.child.stdin.fileno(), self.child.stdout.fileno()
        selector.register(stdout_fd, selectors.EVENT_READ, "channel")
        if out:
            selector.register(stdin_fd, selectors.EVENT_WRITE, "input")
        status = None
        try:
            while status is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    status = "timeout"
                    break
                for key, _ in selector.select(min(left, 0.5)):
                    if key.data == "input":
                        try:
                            out = out[os.write(stdin_fd, out[:65536]):]
                        except OSError:
                            out = b""
                        if not out:
                            selector.unregister(stdin_fd)
                    elif key.data == "channel":
                        try:
                            chunk = os.read(stdout_fd, 65536)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            status = "eof"
                            break
                        self.buffer += chunk
                        if b"\n" in self.buffer:
                            status = "ok"
                        elif len(self.buffer) > LIMITS["output_bytes"]:
                            status = "too long"
                    else:
                        self.capture.read(key)
                        if self.capture.exceeded:
                            status = "too long"
        finally:
            for fd in (stdin_fd, stdout_fd):
                if fd in selector.get_map():
                    selector.unregister(fd)
        if status != "ok":
            self.ended = {"timeout": "it did not answer in time", "eof": "it closed its output",
                          "too long": "it wrote more than its output limit"}[status]
            self.stop()
            return {"status": status, "detail": self.ended}
        line, _, self.buffer = self.buffer.partition(b"\n")
        if len(line) > LIMITS["output_bytes"]:
            self.ended = "its answer was longer than output_bytes"
            self.stop()
            return {"status": "too long", "detail": self.ended}
        return {"status": "ok", "data": base64.b64encode(line).decode()}

    def stop(self):
        if self.child is None or self.child.poll() is not None:
            return
        try:
            os.killpg(self.child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.child.wait()

    def finish(self, request):
        if self.child is None:
            return {"returncode": 0, "stderr": "", "stderr_bytes": 0, "duration_s": 0.0}
        self.stop()
        kill_leftovers(keep=WORKER_PIDS())
        self.capture.drain()
        stderr, stderr_bytes = bytes(self.capture.kept["stderr"]), self.capture.seen["stderr"]
        self.capture.selector.close()
        for stream in (self.child.stdin, self.child.stdout, self.child.stderr):
            stream.close()
        returncode, self.child = self.child.returncode, None
        return {"returncode": returncode, "stderr": base64.b64encode(stderr).decode(), "stderr_bytes": stderr_bytes,
                "duration_s": time.monotonic() - self.started}


#: Landlock (Linux 5.13+), used when the host asks (``LIMITS["confine"]``): the plain-process
#: provider's only way to hide the host's files, since it has no mount namespace.
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
#: Filesystem access rights, by bit: execute, write_file, read_file, read_dir, remove_dir,
#: remove_file, make_char, make_dir, make_reg, make_sock, make_fifo, make_block, make_sym
#: (ABI 1), refer (2), truncate (3), ioctl_dev (5).
FS_RIGHT_BITS = {1: 13, 2: 14, 3: 15, 4: 15, 5: 16}
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
TRUNCATE, IOCTL_DEV = 1 << 14, 1 << 15
#: Network rights (ABI 4): bind and connect TCP; handled with no rule, so none is allowed.
NET_TCP = 1 | 2
#: Scopes (ABI 6): abstract unix sockets and signals outside the sandbox's own processes.
SCOPE_ALL = 1 | 2


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def confine(spec):
    """Restrict this process and all it starts from now on to `spec`'s folders: ``read``
    (read and execute), ``write`` (everything), ``devices`` and ``proc`` (read and write
    existing files); with ABI 4 and 6 also no TCP bind or connect, no signal or abstract
    socket outside the sandbox. A folder that does not exist is skipped. Raises OSError when
    the kernel refuses: the host asked, so a sandbox that cannot be confined does not start."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    every = (1 << FS_RIGHT_BITS[min(abi, 5)]) - 1
    fields = [every, NET_TCP if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0]
    size = 8 * (3 if abi >= 6 else 2 if abi >= 4 else 1)
    attr = (ctypes.c_uint64 * 3)(*fields)
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read = EXECUTE | READ_FILE | READ_DIR
    # Opening for writing truncates (`open(path, "w")`, a shell's `>`): TRUNCATE from ABI 3.
    rights = {"read": read, "write": every, "devices": (read | WRITE_FILE | TRUNCATE | IOCTL_DEV) & every,
              "proc": (READ_FILE | READ_DIR | WRITE_FILE | TRUNCATE) & every}
    try:
        for kind, allowed in rights.items():
            for folder in spec.get(kind, ()):
                try:
                    fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    rule = _PathBeneath(allowed if os.path.isdir(folder) else allowed & (EXECUTE | WRITE_FILE | READ_FILE), fd)
                    if libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) < 0:
                        raise OSError(ctypes.get_errno(), f"landlock_add_rule refused {folder}")
                finally:
                    os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # Not dumpable: code in the sandbox (same user) cannot open /proc/<agent>/fd to forge
    # replies to the host, nor ptrace the agent.
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if LIMITS.get("confine"):
        confine(LIMITS["confine"])
    global WORKER_PIDS
    worker = Worker()
    WORKER_PIDS = lambda: {worker.process.pid} if worker.alive() else set()  # noqa: E731
    worker.start()  # ahead of the first snippet, so a warm sandbox has its interpreter ready
    served = Served()
    handlers = {"run": run, "python": worker.execute, "write": write_file, "read": read_file,
                "spawn": served.spawn, "exchange": served.exchange, "finish": served.finish}
    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            reply = handlers[request["op"]](request)
        except ValueError as exc:
            reply = {"error": "ValueError", "message": str(exc)}
        except Exception as exc:  # the agent serves on whatever one request did
            reply = {"error": type(exc).__name__, "message": str(exc)}
        # Code of any request may have sent the interpreter SIGCONT: frozen again, it gets
        # no CPU until its next snippet.
        worker.freeze()
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()
    worker.stop()
    kill_leftovers()


main()
