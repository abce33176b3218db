"""`python SCRIPT ARGS` as a user runs it, forked from a process that has imported TensorFlow.

A fresh interpreter spends ~4 s of CPU importing TensorFlow before the
script's first line; on CI's two cores that is most of a short script's
run. `tfdist.launch.preload` forks the script from a template process that
imported TensorFlow once (one template per distinct environment), and the
script then runs as `python SCRIPT ARGS` would (the module says exactly
what differs). Tests of the examples and the fault tests' worker program
start their scripts this way; tests that check what a fresh interpreter
imports must not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from collections.abc import Sequence

from tfdist.launch import preload

#: What every template imports once.
PRELOADED = ("tensorflow",)


class ForkedScript:
    """A running `[python, SCRIPT, ARGS...]`, its output read as it comes.

    Args:
      command: `[sys.executable, (-u,) SCRIPT, ARGS...]`.
      env: Its whole environment.
      cwd: Its working directory.
      keep_stdout: Keep its stdout (`stdout`); else read and dropped.
    """

    def __init__(
        self, command: Sequence[str], env: Mapping[str, str], *, cwd: str, keep_stdout: bool = True
    ) -> None:
        self.args = list(command)
        self._process = preload.server_for(PRELOADED, env).start(command, env, cwd=cwd)
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._readers = [
            threading.Thread(
                target=self._drain, args=(self._process.stdout, self._out if keep_stdout else None),
                daemon=True,
            ),
            threading.Thread(target=self._drain, args=(self._process.stderr, self._err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _drain(pipe, into: list[bytes] | None) -> None:
        with pipe:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                if into is not None:
                    into.append(chunk)

    @property
    def pid(self) -> int:
        """Its process id (the same after it re-executes itself)."""
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    @property
    def stdout(self) -> str:
        """What it wrote to stdout so far (all of it once it has exited)."""
        return b"".join(self._out).decode(errors="replace")

    @property
    def stderr(self) -> str:
        """What it wrote to stderr so far (all of it once it has exited)."""
        return b"".join(self._err).decode(errors="replace")

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status; raises `subprocess.TimeoutExpired` after `timeout` s."""
        code = self._process.wait(timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def kill(self, timeout: float) -> None:
        """SIGKILLs it and what it started, if still running; waits up to `timeout` s."""
        if self._process.returncode is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.wait(timeout)


def run(
    command: Sequence[str], env: Mapping[str, str], *, cwd: str, timeout_s: float
) -> subprocess.CompletedProcess:
    """Runs `command` to its end, as `subprocess.run(..., capture_output=True, text=True)`.

    Raises:
      subprocess.TimeoutExpired: If it ran past `timeout_s` (it is killed first).
    """
    script = ForkedScript(command, env, cwd=cwd)
    try:
        code = script.wait(timeout_s)
    except subprocess.TimeoutExpired:
        script.kill(timeout=30)
        raise
    return subprocess.CompletedProcess(script.args, code, script.stdout, script.stderr)
