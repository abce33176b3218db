"""Starts Python tasks by forking a process that has already imported their modules.

    server = preload.server_for(("tensorflow",), env)  # one per (modules, env)
    process = server.start([sys.executable, "train.py", "--flag"], env_with_tf_config,
                           cwd=os.getcwd(), fds=())   # a Popen-like handle
    process.wait()

Every task of a local job imports TensorFlow, ~3 s of CPU each; on a small
machine running many short jobs (tests), that is most of the work.
`LocalJob(..., preload=("tensorflow",))` instead starts one template
process per distinct environment, which imports the modules once and then
forks a child per task; the child runs the task's script as
`python SCRIPT ARGS...` would (`_preload_server.py` says exactly how),
with the task's whole environment.

Which commands: `[PYTHON, SCRIPT.py, ARGS...]` where PYTHON is this
interpreter (`sys.executable`, resolved) and no interpreter option but
`-u` (unbuffered output) comes before SCRIPT; anything else starts as a
fresh process. The template's environment is the task's without
`RUNTIME_VARIABLES` (TF_CONFIG, the thread counts), so modules that read
the environment at import see the task's; those variables are read later,
by then set in the child.

What differs from a fresh interpreter: the task is the template's child,
not the launcher's, so its exit status comes through the template; it has
the template's modules already imported (and their import-time state:
nothing may have started TensorFlow's runtime, which the template never
does); and `sys.flags` are the template's.

Templates live as long as this process (they exit when it does, at the
latest when their socket closes); at most `MAX_SERVERS` are kept, the
least recently used one without running tasks closed first.

POSIX only. This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import atexit
import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from collections.abc import Sequence
from typing import IO
from typing import Any

from tfdist import errors
from tfdist.launch import _preload_server

__all__ = ["ForkedProcess", "PreloadServer", "is_python_script", "server_for"]

#: Templates kept at once (each holds its modules' memory, ~0.5 GB for
#: TensorFlow).
MAX_SERVERS = 4

#: Environment variables read only after import (TF_CONFIG by strategies,
#: the thread counts when TensorFlow's runtime starts) or by no task (the
#: test runner's current test): tasks whose environments differ only in
#: them share a template, and each child gets its own values.
RUNTIME_VARIABLES = frozenset(
    {"TF_CONFIG", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "PYTEST_CURRENT_TEST"}
)

#: Seconds a template has to import its modules and answer.
START_TIMEOUT_S = 120.0

_SERVER_SCRIPT = os.path.abspath(_preload_server.__file__)
_INTERPRETER = os.path.realpath(sys.executable)


#: Interpreter options a forked task may have before SCRIPT.
OPTIONS = frozenset({"-u"})


def is_python_script(program: str, command: Sequence[str]) -> bool:
    """Whether `command` (run as `program`) is `python [-u] SCRIPT.py ...` with this interpreter."""
    options = 0
    while options + 1 < len(command) and command[options + 1] in OPTIONS:
        options += 1
    return (
        len(command) >= options + 2
        and os.path.realpath(program) == _INTERPRETER
        and command[options + 1].endswith(".py")
        and not command[options + 1].startswith("-")
    )


class ForkedProcess:
    """A task forked by a template: the part of `subprocess.Popen` a task uses.

    `pid` leads its own process group (signal it with `os.killpg`);
    `stdout` and `stderr` are the read ends of its output pipes;
    `returncode` is None until its exit is known, then its exit status, or
    -N if signal N killed it.
    """

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._exited = threading.Event()

    def record_exit(self, code: int) -> None:
        """Records the exit status (by the `PreloadServer` that forked it)."""
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Blocks until the process exits; returns its exit status.

        Raises:
          subprocess.TimeoutExpired: If it runs past `timeout` seconds.
        """
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class PreloadServer:
    """One template process: `modules` imported under `env`.

    Thread-safe. `start` blocks until the child is forked.

    Raises (from the constructor):
      LauncherError: If the template cannot start or import a module.
    """

    def __init__(self, modules: Sequence[str], env: Mapping[str, str]) -> None:
        self.modules = tuple(modules)
        parent_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._log = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(
                [sys.executable, _SERVER_SCRIPT, str(server_end.fileno()), *self.modules],
                pass_fds=(server_end.fileno(),),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                start_new_session=True,  # A Ctrl-C reaches tasks through the launcher.
            )
        finally:
            server_end.close()
        self._socket = parent_end
        self._lock = threading.Lock()  # One request at a time.
        self._replies: collections.deque[tuple[Any, ...]] = collections.deque()
        self._reply_ready = threading.Condition(threading.Lock())
        self._children: dict[int, ForkedProcess] = {}
        self._closed = False
        self._socket.settimeout(START_TIMEOUT_S)
        try:
            received = _preload_server.receive(self._socket)
        except OSError:
            received = None
        if received is None or received[0][0] != "ready":
            details = (received[0][1] if received is not None else self._output()).strip()
            self.close()
            problem = details.splitlines()[-1] if details else "no output"
            raise errors.LauncherError(
                f"the template process importing {', '.join(self.modules)} "
                f"did not start: {problem}. Expected those modules to import "
                "in a fresh interpreter with the job's environment (on its "
                "PYTHONPATH, not only this process's sys.path); fix that, or "
                f"start the tasks without preload. Its output:\n{details}"
            )
        self._socket.settimeout(None)
        self._reader = threading.Thread(
            target=self._read, name="tfdist-preload-reader", daemon=True
        )
        self._reader.start()

    @property
    def has_children(self) -> bool:
        """Whether a task it started is still running."""
        return any(child.returncode is None for child in self._children.values())

    @property
    def is_alive(self) -> bool:
        return not self._closed and self._process.poll() is None

    def start(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        cwd: str,
        network_fds: tuple[int, ...] = (),
    ) -> ForkedProcess:
        """Forks a child that runs `command` (a `python SCRIPT ...` command).

        Args:
          command: `[python, SCRIPT, ARGS...]` (see `is_python_script`).
          env: The child's whole environment.
          cwd: Its working directory.
          network_fds: The network namespace to join: `(net_fd,)` or
            `(net_fd, user_fd)`, or `()` for the host's network.

        Raises:
          LauncherError: If the template is gone or cannot fork.
        """
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child = None
        try:
            with self._lock:
                if self._closed:
                    raise errors.LauncherError(
                        "the template process was closed; expected a live "
                        "one. Get one from preload.server_for()."
                    )
                try:
                    _preload_server.send(
                        self._socket,
                        ("start", list(command), dict(env), cwd),
                        (out_w, err_w, *network_fds),
                    )
                except OSError as e:
                    raise self._gone(f"sending the request failed: {e}") from e
                reply = self._next_reply()
                if reply[0] != "started":
                    raise errors.LauncherError(
                        f"the template process could not start {command[1]!r}: "
                        f"{reply[1]}. Expected a fork to succeed; the machine "
                        "may be out of memory or processes."
                    )
                child = ForkedProcess(
                    reply[1], os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb")
                )
                with self._reply_ready:
                    self._children[child.pid] = child
                    self._flush_exits()
            return child
        finally:
            for fd in (out_w, err_w) if child else (out_w, err_w, out_r, err_r):
                _close_quietly(fd)

    def close(self) -> None:
        """Ends the template; tasks it started that still run are killed.

        Their exits could no longer be reported; `server_for` closes only
        templates without running tasks (and all at this process's exit).
        """
        self._closed = True
        try:
            # shutdown, not only close: it wakes the reader thread blocked in
            # recv (which keeps the socket open) and sends the template EOF.
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # Already shut: the template is gone.
        try:
            self._socket.close()
        finally:
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._log.close()

    # The reader thread and its helpers.

    def _read(self) -> None:
        while True:
            try:
                received = _preload_server.receive(self._socket)
            except (OSError, EOFError, ValueError):
                received = None
            if received is None:
                self._lost()
                return
            message, _ = received
            with self._reply_ready:
                self._replies.append(message)
                self._flush_exits()
                self._reply_ready.notify_all()

    def _next_reply(self) -> tuple[Any, ...]:
        """The next "started"/"error" reply (exits stay queued)."""
        with self._reply_ready:
            while True:
                for message in self._replies:
                    if message[0] in ("started", "error"):
                        self._replies.remove(message)
                        return message
                if self._closed or not self._reader.is_alive():
                    raise self._gone("it exited")
                self._reply_ready.wait(1.0)

    def _flush_exits(self) -> None:
        """Delivers queued exits to children already registered (holding `_reply_ready`)."""
        for message in [m for m in self._replies if m[0] == "exit"]:
            child = self._children.pop(message[1], None)
            if child is not None:
                self._replies.remove(message)
                child.record_exit(message[2])

    def _lost(self) -> None:
        """The template is gone: its running children are killed (their exits unknowable)."""
        with self._reply_ready:
            self._closed = True
            self._reply_ready.notify_all()
            for child in self._children.values():
                if child.returncode is None:
                    try:
                        os.killpg(child.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    child.record_exit(-signal.SIGKILL)

    def _gone(self, what: str) -> errors.LauncherError:
        return errors.LauncherError(
            f"the template process importing {', '.join(self.modules)} is "
            f"gone ({what}); its output: {self._output().strip() or 'none'}. "
            "Expected it to serve until this process exits."
        )

    def _output(self) -> str:
        try:
            self._log.seek(0)
            return self._log.read().decode(errors="replace")[-4000:]
        except (OSError, ValueError):
            return ""


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


_servers: collections.OrderedDict[tuple[Any, ...], PreloadServer] = collections.OrderedDict()
_servers_lock = threading.Lock()


def server_for(modules: Sequence[str], env: Mapping[str, str]) -> PreloadServer:
    """The template for `modules` under `env`, started on first use.

    Environments that differ only in `RUNTIME_VARIABLES` get the same
    template, which runs without them.

    Raises:
      LauncherError: If a new template cannot start.
    """
    env = {k: v for k, v in env.items() if k not in RUNTIME_VARIABLES}
    key = (tuple(modules), tuple(sorted(env.items())))
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.is_alive:
            _servers.move_to_end(key)
            return server
        _servers.pop(key, None)
        while len(_servers) >= MAX_SERVERS:
            idle = next((k for k, s in _servers.items() if not s.has_children), None)
            if idle is None:
                break
            _servers.pop(idle).close()
        server = PreloadServer(modules, env)
        _servers[key] = server
        return server


@atexit.register
def _close_all() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()
