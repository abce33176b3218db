"""One task of a local job as an OS process: start, signal, reap.

    task = TaskProcess(index, config, output, events)
    program = find_program(command, env)      # before any task starts
    task.start(program, command, env, network=network)
    task.signal_group(signal.SIGTERM)
    # events receives ("exit", index, exit_code) when the process exits
    task.restart()                            # the same again, after an exit

Each task runs in its own process group (it is the group's leader), with
stdin from /dev/null and its stdout/stderr piped to pumps that prefix every
line with the task, inside the job's private network namespace if it has
one (`isolation`); with `preload`, a `python SCRIPT` task is forked from a
template that imported those modules (`preload`) instead of started
afresh, with the same stdio, group and network. A waiter thread reaps the process and reports its exit
on the job's event queue. A task can be started again once its process has
exited (`restart`): same command, environment, TF_CONFIG and network.

POSIX only (process groups, signals). This module imports nothing from
TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence

from tfdist import errors
from tfdist.cluster import spec
from tfdist.cluster import tf_config
from tfdist.launch import isolation
from tfdist.launch import job
from tfdist.launch import output as output_lib
from tfdist.launch import preload as preload_lib
from tfdist.launch import remote

__all__ = ["Event", "TaskProcess", "find_program"]

#: What the job's event queue carries: ("exit", task index, exit code) from
#: a waiter, or ("stop", -1, signal number) from `LocalJob.request_stop`.
Event = tuple[str, int, int]


def find_program(command: Sequence[str], env: Mapping[str, str]) -> str:
    """Returns the executable `command[0]` names, found as `exec` would.

    A name without a `/` is looked up on `env`'s PATH (as `subprocess` does
    for a child with that environment); a path must be an executable file.

    Raises:
      LauncherError: If there is no such executable.
    """
    path = os.pathsep.join(os.get_exec_path(env))
    program = shutil.which(command[0], path=path)
    if program is None:
        where = f"on PATH={path!r}" if "/" not in command[0] else "there"
        raise errors.LauncherError(
            f"command[0]={command[0]!r} is not an executable file {where}; "
            "expected an executable on PATH or a path to one. Check the "
            "command."
        )
    return program


@dataclasses.dataclass
class _Life:
    """One process of a task: started once, reaped once."""

    process: subprocess.Popen[bytes] | preload_lib.ForkedProcess
    pumps: list[threading.Thread]
    waiter: threading.Thread


class TaskProcess:
    """One task: its current process, output pumps and exit waiter.

    Args:
      index: The task's position in the job, reported with its exit.
      config: The task's TF_CONFIG (`config.task` is the task).
      output: Where its prefixed output lines go.
      events: Where its exits are reported.
    """

    def __init__(
        self,
        index: int,
        config: spec.ClusterConfig,
        output: output_lib.TaskOutput,
        events: queue.SimpleQueue[Event],
    ) -> None:
        assert config.task is not None  # LocalJob builds one per task.
        self.index = index
        self.task: spec.TaskSpec = config.task
        self.config = config
        self.exit_code: int | None = None
        self.was_stopped = False
        self.was_killed = False
        self._output = output
        self._events = events
        self._lives: list[_Life] = []
        self._start_args: (
            tuple[
                str,
                Sequence[str],
                Mapping[str, str],
                isolation.PrivateNetwork | None,
                Sequence[str],
                bool,
            ]
            | None
        ) = None
        self._relays_signals = False

    def start(
        self,
        program: str,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        network: isolation.PrivateNetwork | None = None,
        preload: Sequence[str] = (),
        relay_signals: bool = False,
    ) -> None:
        """Starts the process: `command` with `env` plus the task's TF_CONFIG.

        Args:
          program: The executable, as `find_program(command, env)` found it.
          command: Its argv, `command[0]` included.
          env: The task's environment, without TF_CONFIG.
          network: The private network namespace to run it in, or `None`
            for the host's network.
          preload: Modules imported once in a template process; a
            `python SCRIPT ...` command is then forked from it
            (`tfdist.launch.preload`) instead of started afresh.
          relay_signals: Whether `command` is a remote shell running
            `tfdist.launch.remote_task` on another host: `signal_group` then
            writes signals to its standard input (SIGKILL kills it, and the
            host end then kills the task).

        Raises:
          LauncherError: If the process cannot be started.
        """
        self._start_args = (program, command, env, network, preload, relay_signals)
        self._relays_signals = relay_signals
        task_env = dict(env)
        task_env[tf_config.TF_CONFIG_ENV_VAR] = self.config.to_json()
        process: subprocess.Popen[bytes] | preload_lib.ForkedProcess
        if preload and preload_lib.is_python_script(program, command):
            process = preload_lib.server_for(preload, env).start(
                command,
                task_env,
                cwd=os.getcwd(),
                network_fds=() if network is None else network.descriptors(),
            )
        else:
            process = self._popen(program, command, task_env, network, relay_signals)
        self.exit_code = None
        prefix = f"[{self.task.name}] "
        self._lives.append(
            _Life(
                process,
                pumps=[
                    output_lib.start_pump(
                        process.stdout, prefix, "stdout", self._output
                    ),
                    output_lib.start_pump(
                        process.stderr, prefix, "stderr", self._output
                    ),
                ],
                waiter=output_lib.start_daemon(
                    f"tfdist-{self.task.name}-wait",
                    self._wait_for_exit,
                    process,
                ),
            )
        )

    def _popen(
        self,
        program: str,
        command: Sequence[str],
        task_env: Mapping[str, str],
        network: isolation.PrivateNetwork | None,
        relay_signals: bool,
    ) -> subprocess.Popen[bytes]:
        argv, fds = list(command), tuple[int, ...]()
        if network is not None:
            argv, fds = network.wrap(program, command)
        try:
            return subprocess.Popen(
                argv,
                executable=program if network is None else None,
                pass_fds=fds,
                env=task_env,
                stdin=subprocess.PIPE if relay_signals else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Own process group; see signal_group.
            )
        except OSError as e:
            raise errors.LauncherError(
                f"cannot start task {self.task.name}: {program!r} failed "
                f"with {e.strerror or e}; expected an executable it can run. "
                "Check the command."
            ) from e

    def restart(self) -> None:
        """Starts the task again as `start` did, once its exit is recorded.

        Raises:
          RuntimeError: If the task never started or is still running.
          LauncherError: If the process cannot be started.
        """
        if self._start_args is None or self.is_running:
            raise RuntimeError(
                f"TaskProcess.restart() on task {self.task.name}, which "
                f"{'never started' if self._start_args is None else 'runs'}; "
                "restart a task only after its exit was recorded."
            )
        program, command, env, network, preload, relay_signals = self._start_args
        self.start(
            program, command, env, network=network, preload=preload, relay_signals=relay_signals
        )

    @property
    def restarts(self) -> int:
        """How many times the task was started again."""
        return max(len(self._lives) - 1, 0)

    def _wait_for_exit(
        self, process: subprocess.Popen[bytes] | preload_lib.ForkedProcess
    ) -> None:
        self._events.put(("exit", self.index, process.wait()))

    @property
    def is_running(self) -> bool:
        """Whether a process started and its exit was not yet recorded."""
        return bool(self._lives) and self.exit_code is None

    def signal_group(self, signal_number: int) -> bool:
        """Signals the task's process group; returns whether it was alive."""
        if not self.is_running:
            return False
        process = self._lives[-1].process
        if process.returncode is not None:
            return False
        if self._relays_signals and signal_number != signal.SIGKILL:
            assert isinstance(process, subprocess.Popen) and process.stdin is not None
            try:
                process.stdin.write(remote.encode_signal(signal_number))
                process.stdin.flush()
            except (BrokenPipeError, ValueError):  # The remote shell has gone.
                return False
            return True
        try:
            # start_new_session=True made the task the leader of its group.
            os.killpg(process.pid, signal_number)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def reap(self) -> None:
        """Waits for the current process to exit and records its code.

        Kill it first (`signal_group`): this blocks until it exits.
        """
        if not self._lives:
            return
        # The waiter thread reaps; Popen.wait is safe to call alongside it.
        self.exit_code = self._lives[-1].process.wait()
        for life in self._lives:
            life.waiter.join()

    def drain(self, deadline_s: float, *, wait_s: float) -> None:
        """Waits until `deadline_s` (monotonic) for the output pumps to end.

        A pump still open then is held by a process one of the task's
        processes left behind in its process group: that group is killed
        (SIGKILL) and its pumps get `wait_s` more. A pump open even after
        that (a process that left the group) is abandoned; it is a daemon
        thread. Call after `reap`.
        """
        for life in self._lives:
            for pump in life.pumps:
                pump.join(max(0.0, deadline_s - time.monotonic()))
            if any(pump.is_alive() for pump in life.pumps):
                try:
                    os.killpg(life.process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                for pump in life.pumps:
                    pump.join(wait_s)

    def result(self) -> job.TaskResult:
        """The task's result; only after `reap`."""
        assert self.exit_code is not None  # Only built after reaping.
        return job.TaskResult(
            self.task,
            self.exit_code,
            was_stopped=self.was_stopped,
            was_killed=self.was_killed,
            restarts=self.restarts,
        )
