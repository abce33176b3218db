"""A whole local job as the command line runs it: restarts, signals, deadline.

    result = run_local_job(["python", "-u", "train.py"], JobShape(2),
                           env=dict(os.environ), restarts=2, timeout_s=600)

`run_local_job` adds what `tfdist-launch` offers on top of `LocalJob`:

    for attempt in 0..restarts:                    # a FAILED job, whole
        cluster = make_local_cluster(shape)        # fresh ports each attempt
        result = LocalJob(cluster, ...).run(timeout_s=time left)  # a fresh
                                                   # private network each
        if result is not FAILED, or a signal came, or time is up: return it
    return the last result

In a parameter-server job (`shape.kind`) a worker that dies is first
restarted alone, inside the attempt (`LocalJob`, `worker_restarts`); only a
failure of the job itself relaunches all tasks. SIGINT/SIGTERM received by
the launcher (main thread only) are forwarded to
the running attempt's tasks, and end the job. Whether the tasks run in a
private network namespace is decided once, before the first attempt; if
they cannot, the launcher says so once and carries on without.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TextIO

from tfdist import errors
from tfdist import _validation as validation
from tfdist.launch import isolation
from tfdist.launch import job
from tfdist.launch import ports
from tfdist.launch import supervisor

__all__ = ["run_local_job"]


class _SignalForwarder:
    """Forwards SIGINT/SIGTERM to the current job while installed."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.job: supervisor.LocalJob | None = None
        self.signal_number: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signal_number: int, frame: object) -> None:
        del frame
        self.signal_number = signal_number
        if self.job is not None:
            self.job.request_stop(signal_number)

    def __enter__(self) -> _SignalForwarder:
        # signal.signal works only in the main thread; elsewhere, no-op.
        if threading.current_thread() is threading.main_thread():
            for signal_number in self._SIGNALS:
                self._previous[signal_number] = signal.signal(
                    signal_number, self._handle
                )
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signal_number, handler in self._previous.items():
            # None: the previous handler was not installed from Python.
            signal.signal(
                signal_number,
                signal.SIG_DFL if handler is None else handler,  # type: ignore[arg-type]
            )


def run_local_job(
    command: Sequence[str],
    shape: job.JobShape,
    *,
    env: Mapping[str, str],
    restarts: int = 0,
    timeout_s: float | None = None,
    grace_period_s: float = supervisor.DEFAULT_GRACE_PERIOD_S,
    worker_restarts: int = supervisor.DEFAULT_WORKER_RESTARTS,
    isolate: bool | None = None,
    forward_signals: bool = False,
    preload: Sequence[str] = (),
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> job.JobResult:
    """Runs a job on a fresh local cluster, restarting it after failures.

    Each attempt gets a new `make_local_cluster` (fresh ports, so a task
    that lingers or a port in TIME_WAIT cannot break the next attempt; a
    script must not depend on its port across restarts). Only a `FAILED`
    attempt is restarted; a timeout or a stop request ends the job. The
    launcher's own messages go to `stderr` prefixed `tfdist-launch: `:
    `starting ...` with every task's address before each attempt, and
    `restart i/K` before each restart.

    Args:
      command: The program and arguments every task runs.
      shape: The job's tasks.
      env: The tasks' environment, without TF_CONFIG.
      restarts: How many times to relaunch the whole job after a failure.
      worker_restarts: In a parameter-server job, how many times each
        worker task may be restarted alone within one attempt.
      timeout_s: Limit on all attempts together, or `None`.
      grace_period_s: Seconds a stopped task has to exit before SIGKILL.
      isolate: Whether the tasks run in a private network namespace (each
        attempt its own): True requires it, False runs them on the host's
        network, None isolates them where the OS allows it and otherwise
        says so once on `stderr` and runs them on the host's network.
      forward_signals: Whether to forward SIGINT/SIGTERM received by this
        process to the tasks (main thread only; handlers are restored on
        return).
      preload: Modules imported once, in a template process that every
        attempt's `python SCRIPT` tasks are forked from (`LocalJob`'s
        `preload`; a restart then costs a fork, not an import); `()`
        starts each task as a fresh process.
      stdout: Where task stdout goes; `None` means `sys.stdout`.
      stderr: Where task stderr and launcher messages go; `None` means
        `sys.stderr`.

    Returns:
      The result of the last attempt; `timeout_s` in it is the whole job's.

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If `restarts` or `worker_restarts` is out of range, the
        command is empty, a parameter-server job has no chief, a task
        cannot be started, or `isolate=True` but the OS does not allow it.
      ConfigError: If `timeout_s` or `grace_period_s` is not positive.

    Example:
      >>> result = run_local_job(["python", "-u", "train.py"], JobShape(2),
      ...                        env=dict(os.environ), restarts=1)
      >>> result.exit_status
      0
    """
    if not isinstance(shape, job.JobShape):
        raise TypeError(
            f"shape must be a JobShape; received shape={shape!r} of type "
            f"{type(shape).__name__}."
        )
    argv = job.check_command(command)
    restarts = validation.check_non_negative_int(
        "restarts", restarts, error=errors.LauncherError
    )
    if timeout_s is not None:
        timeout_s = validation.check_positive_number("timeout_s", timeout_s)
    validation.check_positive_number("grace_period_s", grace_period_s)

    def log(message: str) -> None:
        sink = stderr if stderr is not None else sys.stderr
        sink.write(f"tfdist-launch: {message}\n")
        sink.flush()

    is_isolated = isolation.should_isolate(isolate, report=log)
    network = (
        "in a private network namespace"
        if is_isolated
        else "on this host's network"
    )
    deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
    forwarder = _SignalForwarder()
    with contextlib.ExitStack() as stack:
        if forward_signals:
            stack.enter_context(forwarder)
        attempt = 0
        while True:
            cluster = ports.make_local_cluster(shape)
            local_job = supervisor.LocalJob(
                cluster,
                argv,
                env=env,
                grace_period_s=grace_period_s,
                worker_restarts=worker_restarts,
                isolate=is_isolated,
                preload=preload,
                stdout=stdout,
                stderr=stderr,
            )
            forwarder.job = local_job
            if forwarder.signal_number is not None:
                local_job.request_stop(forwarder.signal_number)
            log(
                f"starting {cluster.num_tasks} task(s) {network}: "
                + ", ".join(
                    f"{t.name}={cluster.address(t)}" for t in cluster.tasks()
                )
            )
            remaining_s = None
            if deadline_s is not None:
                remaining_s = max(deadline_s - time.monotonic(), 1e-3)
            result = local_job.run(timeout_s=remaining_s)
            if result.outcome is job.JobOutcome.TIMED_OUT:
                result = dataclasses.replace(result, timeout_s=timeout_s)
            forwarder.job = None
            if (
                result.outcome is not job.JobOutcome.FAILED
                or attempt >= restarts
                or forwarder.signal_number is not None
                or (deadline_s is not None and time.monotonic() >= deadline_s)
            ):
                return result
            attempt += 1
            log(
                f"restart {attempt}/{restarts}: {result.describe()} "
                f"Relaunching all {cluster.num_tasks} task(s) on fresh ports."
            )
