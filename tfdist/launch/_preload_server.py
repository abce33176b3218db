"""The template process of `tfdist.launch.preload`: imports once, forks per task.

    python /path/to/tfdist/launch/_preload_server.py SOCKET_FD MODULE...

Run as a script (by `preload.PreloadServer` only), with the environment
every task it starts will have but `preload.RUNTIME_VARIABLES`. It imports the MODULEs, then
serves requests on the Unix stream socket SOCKET_FD, single-threaded:

- It first sends `("ready", None)`, or `("error", text)` if an import
  failed (and exits 1).
- A request is `("start", argv, env, cwd)` with 2 to 4 file descriptors
  attached: the task's stdout and stderr, then optionally the network
  namespace to join (net, and user if any). It forks a child that runs
  `argv` = `[python, [-u,] SCRIPT, ARGS...]` as the interpreter would,
  and answers `("started", pid)` (or `("error", text)` if the fork
  failed).
- When a child exits it sends `("exit", pid, code)`: its exit status, or
  -N if signal N killed it (as `subprocess.Popen.returncode`).
- At EOF on the socket (its parent is gone or done) it exits; it does
  not wait for its children (each leads its own session; the parent
  kills those still running when it can no longer learn their exits).

The child: leads a new session and process group; has stdin from
/dev/null and the attached stdout/stderr; joins the network namespace;
sets `os.environ` to `env` and the working directory to `cwd`; runs
SCRIPT as `__main__` with `sys.argv = [SCRIPT, ARGS...]`,
`sys.orig_argv = [PYTHON, (-u,) SCRIPT, ARGS...]` and SCRIPT's
directory first on `sys.path`; then returns up this program's stack, so
that the interpreter exits as after any script: joins non-daemon threads,
runs `atexit` functions, flushes stdout/stderr, and a SystemExit or an
uncaught exception (traceback on stderr, with this program's frames
above the script's) sets the exit status.

This file imports only the standard library (and `_netns.py`, by path)
before the MODULEs.
"""

from __future__ import annotations

import os
import sys

if (
    __name__ == "__main__"
    and sys.path
    and sys.path[0] == os.path.dirname(os.path.abspath(__file__))
):
    # Running a script puts its own directory, tfdist/launch/, first on
    # sys.path; it is no package root, so take it off before any import.
    del sys.path[0]

import importlib  # noqa: E402
import importlib.util  # noqa: E402
import io  # noqa: E402
import pickle  # noqa: E402
import runpy  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

# Messages: a 4-byte big-endian length, then a pickle. At most this many
# descriptors ride on one request.
_HEADER = struct.Struct(">I")
MAX_FDS = 4


def send(sock: socket.socket, message: Any, fds: tuple[int, ...] = ()) -> None:
    """Sends one message (and `fds`, on its first byte) on `sock`."""
    payload = pickle.dumps(message)
    data = _HEADER.pack(len(payload)) + payload
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def receive(sock: socket.socket) -> tuple[Any, list[int]] | None:
    """Receives one message and its descriptors; None at EOF."""
    data, fds, _, _ = socket.recv_fds(sock, _HEADER.size, MAX_FDS)
    if not data:
        return None
    while len(data) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(data))
        if not more:
            return None
        data += more
    (length,) = _HEADER.unpack(data)
    payload = b""
    while len(payload) < length:
        more = sock.recv(length - len(payload))
        if not more:
            return None
        payload += more
    return pickle.loads(payload), fds


def _load_netns() -> Any:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_netns.py")
    spec = importlib.util.spec_from_file_location("_tfdist_netns", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stream(fd: int, *, unbuffered: bool, line_buffering: bool) -> io.TextIOWrapper:
    """A text stream on `fd` as a fresh interpreter's sys.stdout/stderr."""
    raw = io.FileIO(fd, "w", closefd=False)
    buffered = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(
        buffered,  # type: ignore[arg-type]  # FileIO is a binary stream too.
        encoding="utf-8",
        errors="backslashreplace" if fd == 2 else "strict",
        line_buffering=line_buffering,
        write_through=unbuffered,
    )


def _run_child(argv: list[str], env: dict[str, str], cwd: str, fds: list[int], netns: Any) -> int:
    """Becomes the task (in the forked child) and runs its script.

    Returns 0 when the script ends, 126 if the network namespace cannot be
    joined; the script's SystemExit or uncaught exception propagates.
    """
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds[:2]:
        os.close(fd)
    if len(fds) > 2:
        user_fd = fds[3] if len(fds) > 3 else -1
        if not netns.join(fds[2], user_fd):
            return 126
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    options = 0
    while argv[options + 1] == "-u":
        options += 1
    unbuffered = bool(options or env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = _stream(1, unbuffered=unbuffered, line_buffering=False)
    sys.stderr = _stream(2, unbuffered=unbuffered, line_buffering=True)
    script = argv[options + 1]
    sys.argv = argv[options + 1 :]
    # As `python [-u] SCRIPT ARGS` would have it (a program that restarts
    # itself reads it: tfdist.launch.isolation.restart_in_private_network).
    sys.orig_argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def _start(
    sock: socket.socket, wake_r: int, request: tuple[Any, ...], fds: list[int], netns: Any
) -> int | None:
    """Forks the task of `request`; in the child, returns its exit status
    (a SystemExit or an exception from its script propagates), in the
    server None."""
    _, argv, env, cwd = request
    try:
        pid = os.fork()
    except OSError as e:
        for fd in fds:
            os.close(fd)
        send(sock, ("error", f"fork failed: {e}"))
        return None
    if pid == 0:
        sock.close()
        os.close(wake_r)
        return _run_child(argv, env, cwd, fds, netns)
    for fd in fds:
        os.close(fd)
    send(sock, ("started", pid))
    return None


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send(sock, ("exit", pid, os.waitstatus_to_exitcode(status)))


def serve(sock: socket.socket, modules: list[str]) -> int:
    """Imports `modules`, then serves requests until EOF; returns the exit status.

    Returns (or raises) in each forked child too, with the task's outcome.
    """
    try:
        for name in modules:
            importlib.import_module(name)
        netns = _load_netns()
    except BaseException:  # noqa: BLE001 - reported to the parent.
        send(sock, ("error", traceback.format_exc()))
        return 1
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # Wakes select via the pipe.
    send(sock, ("ready", None))
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 512)
            _reap(sock)
        if sock.fileno() in readable:
            received = receive(sock)
            if received is None:
                return 0
            request, fds = received
            child_exit_status = _start(sock, wake_r, request, fds, netns)
            if child_exit_status is not None:
                # In the child: return up the stack and exit as the
                # interpreter does (joins threads, runs atexit, flushes).
                return child_exit_status
            _reap(sock)


def main(args: list[str]) -> int:
    sock = socket.socket(fileno=int(args[0]))
    return serve(sock, args[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
