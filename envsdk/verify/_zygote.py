# mypy: ignore-errors
# ruff: noqa: F821  (names from _plaindata.py and _verifier.py, whose text comes first)
# (Not imported by envsdk: the last part of the verifier's -c source; see _verifier.py.)
"""The zygote: one interpreter per server that has imported what a verifier needs and forks a
fresh verifier for each verification, so none pays an interpreter's start-up.

It reads requests on the Unix socket whose number is its only argument: a JSON object
``{"timeout_s", "memory_bytes"}`` with two descriptors (the verifier's stdin and stdout),
answered with the child's pid as one line. The child drops everything else it inherited and
dies by itself: at EOF on its stdin, past its CPU time, or past its wall clock (SIGALRM's
default action), so nobody has to signal it by a pid that may have been reused. The zygote
exits when its socket closes: with the server, however it ended.
"""

import math as _math
import os as _zos
import resource as _resource
import signal as _signal
import socket as _socket
import sys as _zsys


def _serve(sock):
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        message, fds, _, _ = _socket.recv_fds(sock, 4096, 2)
        if not message:
            return
        request = _json.loads(message)
        if len(fds) != 2:
            for fd in fds:
                _zos.close(fd)
            sock.sendall(b"0\n")
            continue
        pid = _zos.fork()
        if pid == 0:
            try:
                sock.close()
                _zos.setsid()
                _zos.dup2(fds[0], 0)
                _zos.dup2(fds[1], 1)
                _zos.closerange(3, _resource.getrlimit(_resource.RLIMIT_NOFILE)[0])
                seconds = max(1, _math.ceil(request["timeout_s"]))
                _resource.setrlimit(_resource.RLIMIT_CPU, (seconds + 1, seconds + 1))
                _resource.setrlimit(_resource.RLIMIT_AS, (request["memory_bytes"],) * 2)
                _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
                _signal.alarm(seconds + 2)
                main()
            finally:
                _zos._exit(0)
        for fd in fds:
            _zos.close(fd)
        sock.sendall(b"%d\n" % pid)


_serve(_socket.socket(fileno=int(_zsys.argv[1])))
