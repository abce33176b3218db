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
failure of the job itself relaunches all tasks.

Elastic jobs (`min_workers` below `shape.num_workers`, or a `slots_file` or
`hosts_file`; `membership`) change the number of workers between attempts,
multi-worker and parameter-server jobs alike (the chief, ps and evaluator
tasks stay; a parameter-server worker is lost only once it has used its
`worker_restarts`):

    attempt ends                         next attempt
    a task exited 143 (preempted,        the same workers; no restart used
      its state saved at a step)
    the slots file changed, or where     min(slots, MAX) workers; no restart
      the hosts file would put the       used (the tasks were stopped with
      tasks                              SIGTERM, and saved at a step)
    a worker was lost (killed by a       one worker fewer (with a slots or
      signal; ssh's 255)                 hosts file: min(slots, MAX), the
                                         lost worker's host left out); a
                                         restart used
    fewer than min_workers left          the job fails with TooFewWorkersError
                                         (`JobResult.error`) naming the lost task

Each change is logged (`membership: 3 -> 2 worker(s) ...`) with what caused
it and, once the next attempt is running, how long the change took. SIGINT/SIGTERM received by
the launcher (main thread only) are forwarded to
the running attempt's tasks, and end the job. Whether the tasks run in a
private network namespace is decided once, before the first attempt; if
they cannot, the launcher says so once and carries on without.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TextIO

from tfdist import errors
from tfdist import _validation as validation
from tfdist.cluster import spec
from tfdist.cluster import tf_config
from tfdist.launch import hosts as hosts_lib
from tfdist.launch import isolation
from tfdist.launch import job
from tfdist.launch import membership
from tfdist.launch import ports
from tfdist.launch import remote
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
    min_workers: int | None = None,
    slots_file: str | None = None,
    hosts_file: str | None = None,
    remote_shell: remote.RemoteShell | None = None,
    port: int = hosts_lib.DEFAULT_PORT,
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
      min_workers: Elastic jobs: the fewest workers the job may run on
        (`shape.num_workers` is the most); None: exactly
        `shape.num_workers`.
      slots_file: Elastic jobs: a file holding how many worker slots the
        job may use now, re-read while it runs (see `membership`); None:
        the count changes only when a worker is lost.
      hosts_file: Runs the tasks on the hosts this file lists
        (`hosts.HostsFile`: `HOST slots=N` lines, re-read while the job
        runs, like `slots_file`) through `remote_shell`,
        instead of on this machine; a host whose worker was lost is left
        out. None: every task runs here, on 127.0.0.1.
      remote_shell: With `hosts_file`: how a task is started on its host;
        None means `remote.RemoteShell()` (ssh).
      port: With `hosts_file`: the first task's port on each host (the
        k-th task on a host listens on `port + k`).
      stdout: Where task stdout goes; `None` means `sys.stdout`.
      stderr: Where task stderr and launcher messages go; `None` means
        `sys.stderr`.

    Returns:
      The result of the last attempt; `timeout_s` in it is the whole job's.
      An elastic job that falls below `min_workers` returns the attempt in
      which the last worker it could spare was lost (`FAILED`), its `error`
      a `TooFewWorkersError` naming the lost task.

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If `restarts` or `worker_restarts` is out of range, the
        command is empty, a parameter-server job has no chief, a task
        cannot be started, `isolate=True` but the OS does not allow it,
        `min_workers` is out of range, or the slots or hosts file grants
        fewer than `min_workers` at the start, or the hosts file cannot be
        read or is malformed.
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
    workers = _worker_range(shape, min_workers)
    if hosts_file is not None and slots_file is not None:
        raise errors.LauncherError(
            f"a job takes its workers' count from a slots file or a hosts "
            f"file, not both; received slots_file={slots_file!r} and "
            f"hosts_file={hosts_file!r}. The hosts file's slots are the "
            "count: drop the slots file."
        )

    def log(message: str) -> None:
        sink = stderr if stderr is not None else sys.stderr
        sink.write(f"tfdist-launch: {message}\n")
        sink.flush()

    def too_few(result: job.JobResult, message: str, task: str | None = None) -> job.JobResult:
        """The job's end below MIN workers: `result` failed with a `TooFewWorkersError`."""
        log(f"membership: {message}")
        return dataclasses.replace(
            result,
            outcome=job.JobOutcome.FAILED,
            error=errors.TooFewWorkersError(message, task=task),
        )

    hosts: hosts_lib.HostsFile | None = None
    if hosts_file is not None:
        if isolate or preload:
            raise errors.LauncherError(
                f"tasks on the hosts of a hosts file run on those hosts' "
                f"networks, each started afresh; received isolate={isolate!r}, "
                f"preload={tuple(preload)!r} with hosts_file={hosts_file!r}. "
                "Drop isolate and preload."
            )
        hosts = hosts_lib.HostsFile(hosts_file, shape, port=port)
        log(
            "the tasks run on their hosts' networks: TensorFlow's servers "
            "listen on every interface (*:PORT) without authentication, so "
            "let only the job's hosts reach the job's ports (a firewall); see "
            "docs/security.md in tfdist's repository."
        )
        remote_shell = remote_shell or remote.RemoteShell()
        is_isolated = False  # Each task is on its host's network.
        network = f"on their hosts through {shlex.join(remote_shell.rsh)}"
    else:
        is_isolated = isolation.should_isolate(isolate, report=log)
        network = (
            "in a private network namespace"
            if is_isolated
            else "on this host's network"
        )
    deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
    forwarder = _SignalForwarder()
    num_workers = shape.num_workers
    granted = _granted(hosts, slots_file, workers)
    if granted is not None:
        count = granted()
        if count is not None and count < workers.minimum:
            raise errors.LauncherError(
                f"the {_source(hosts_file, slots_file)} grants {count} "
                f"worker(s), fewer than the {workers.minimum} the job needs "
                f"(--workers {workers}). Start it once the file grants "
                "enough, or lower MIN."
            )
        if count is not None:
            num_workers = count
    change: _Change | None = None
    with contextlib.ExitStack() as stack:
        if forward_signals:
            stack.enter_context(forwarder)
        attempt = 0
        while True:
            placement = None
            task_command: Sequence[str] | Callable[[spec.TaskSpec], Sequence[str]] = argv
            if hosts is not None:
                placement = hosts.placement(num_workers)
                cluster = placement.cluster()
                assert remote_shell is not None
                task_command = _remote_commands(placement, cluster, argv, env, remote_shell)
            else:
                cluster = ports.make_local_cluster(
                    dataclasses.replace(shape, num_workers=num_workers)
                )
            local_job = supervisor.LocalJob(
                cluster,
                task_command,
                env=env,
                grace_period_s=grace_period_s,
                worker_restarts=worker_restarts,
                isolate=is_isolated,
                preload=preload,
                relay_signals=hosts is not None,
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
            if change is not None:
                log(
                    f"membership: {change.before} -> {num_workers} worker(s) "
                    f"re-formed {time.monotonic() - change.at_s:.1f} s after "
                    f"{change.cause}."
                )
                change = None
            watcher = None
            if hosts is not None and placement is not None:
                watcher = membership.GrantWatcher(
                    hosts.grant,
                    current=placement.hosts,
                    on_change=lambda _: local_job.request_stop(signal.SIGTERM),
                )
            elif slots_file is not None:
                watcher = membership.GrantWatcher(
                    membership.slots_grant(slots_file, workers),
                    current=num_workers,
                    on_change=lambda _: local_job.request_stop(signal.SIGTERM),
                )
            if watcher is not None:
                watcher.start()
            remaining_s = None
            if deadline_s is not None:
                remaining_s = max(deadline_s - time.monotonic(), 1e-3)
            try:
                result = local_job.run(timeout_s=remaining_s)
            finally:
                if watcher is not None:
                    watcher.stop()
            if result.outcome is job.JobOutcome.TIMED_OUT:
                result = dataclasses.replace(result, timeout_s=timeout_s)
            forwarder.job = None
            if (
                result.outcome is job.JobOutcome.SUCCEEDED
                or result.outcome is job.JobOutcome.TIMED_OUT
                or forwarder.signal_number is not None
                or (deadline_s is not None and time.monotonic() >= deadline_s)
            ):
                return result
            # When the exit or request that ended the attempt happened.
            ended_s = time.monotonic() - (result.elapsed_s - result.decided_after_s)
            if hosts is not None:
                hosts.refresh()
            if watcher is not None and watcher.target is not None:
                assert granted is not None
                target = granted()
                if target is None:  # Unreadable again: the grant that was read.
                    target = num_workers if hosts is not None else watcher.target
                source = _source(hosts_file, slots_file)
                cause = (
                    f"the {source} changed"
                    if hosts is not None
                    else f"the {source} asked for {target}"
                ) + "; the tasks were stopped at a step"
                if target < workers.minimum:
                    return too_few(result, _stopped_below(source, target, workers))
                change = _Change(num_workers, cause, ended_s)
                log(f"membership: {num_workers} -> {target} worker(s): {cause}.")
                num_workers = target
                continue
            if result.outcome is not job.JobOutcome.FAILED:
                return result
            failed = (
                result.task_result(result.failed_task)
                if result.failed_task is not None
                else None
            )
            if failed is not None and failed.exit_code == errors.PREEMPTED_EXIT_CODE and (
                workers.is_elastic or granted is not None
            ):
                cause = f"task {failed.task.name} was preempted (saved at a step, exit 143)"
                change = _Change(num_workers, cause, ended_s)
                if hosts is not None:
                    num_workers = hosts.workers()  # The hosts may have changed meanwhile.
                    if num_workers < workers.minimum:
                        return too_few(result, _stopped_below(_source(hosts_file, None), num_workers, workers))
                log(f"membership: {cause}; relaunching {num_workers} worker(s).")
                continue
            if (
                workers.is_elastic
                and failed is not None
                and failed.task.task_type == "worker"
                and _is_lost(failed.exit_code)
            ):
                lost = f"task {failed.task.name} {failed.describe()}"
                target = num_workers - 1
                if hosts is not None and placement is not None:
                    host = placement.host_of(failed.task)
                    hosts.leave_out(host)
                    lost += f" (host {host} is left out until the hosts file drops it)"
                if granted is not None:
                    # The file, not the loss, says what the job may use.
                    count = granted()
                    if count is not None:
                        target = count
                if target < workers.minimum:
                    message = (
                        f"{lost}, leaving {target} "
                        f"worker(s), fewer than the {workers.minimum} the job "
                        f"needs (--workers {workers}); failing the job. Find out "
                        "why it was lost (its output above); run the job again "
                        "to resume from the last committed state, or lower MIN."
                    )
                    return too_few(result, message, task=failed.task.name)
                if attempt >= restarts:
                    return result
                attempt += 1
                change = _Change(num_workers, lost, ended_s)
                log(
                    f"membership: {num_workers} -> {target} worker(s): "
                    f"{lost} (restart {attempt}/{restarts}); resuming from the "
                    "newest state saved (the survivors' last step, else the last commit)."
                )
                num_workers = target
                continue
            if attempt >= restarts:
                return result
            attempt += 1
            if hosts is not None:  # On the hosts listed now.
                num_workers = hosts.workers()
                if num_workers < workers.minimum:
                    return too_few(result, _stopped_below(_source(hosts_file, None), num_workers, workers))
            log(
                f"restart {attempt}/{restarts}: {result.describe()} "
                f"Relaunching all {cluster.num_tasks} task(s) on fresh ports."
            )


def _granted(
    hosts: hosts_lib.HostsFile | None, slots_file: str | None, workers: membership.WorkerRange
) -> Callable[[], int | None] | None:
    """How many workers the job's file grants now (None: unreadable); None without a file."""
    if hosts is not None:
        return hosts.workers
    if slots_file is not None:
        return membership.slots_grant(slots_file, workers)
    return None


def _stopped_below(source: str, count: int, workers: membership.WorkerRange) -> str:
    return (
        f"the {source} grants {count} worker(s), fewer than the "
        f"{workers.minimum} the job needs (--workers {workers}); stopped the "
        "job (its tasks saved at a step: run it again to resume)."
    )


def _source(hosts_file: str | None, slots_file: str | None) -> str:
    return f"hosts file {hosts_file!r}" if hosts_file is not None else f"slots file {slots_file!r}"


def _remote_commands(
    placement: hosts_lib.Placement,
    cluster: spec.ClusterSpec,
    argv: Sequence[str],
    env: Mapping[str, str],
    shell: remote.RemoteShell,
) -> Callable[[spec.TaskSpec], Sequence[str]]:
    """Each task's local command: the remote shell running it on its host, with its TF_CONFIG."""
    cwd = os.getcwd()
    # The launcher tells the user, once, that remote tasks listen on every interface.
    env = dict(env, **{isolation.NOTICE_GIVEN_ENV: "1"})

    def command(task: spec.TaskSpec) -> Sequence[str]:
        config = spec.ClusterConfig(cluster=cluster, task=task).to_json()
        task_env = dict(env, **{tf_config.TF_CONFIG_ENV_VAR: config})
        return shell.command(placement.host_of(task), argv, task_env, cwd=cwd)

    return command


def _is_lost(exit_code: int) -> bool:
    """Whether an exit looks like a lost worker (killed by a signal), not a script's error."""
    return exit_code < 0 or (exit_code > 128 and exit_code != errors.PREEMPTED_EXIT_CODE)


@dataclasses.dataclass(frozen=True)
class _Change:
    """A membership change under way: the count before, why, when the attempt ended."""

    before: int
    cause: str
    at_s: float


def _worker_range(shape: job.JobShape, min_workers: int | None) -> membership.WorkerRange:
    """The job's worker range."""
    if min_workers is None:
        return membership.WorkerRange(shape.num_workers, shape.num_workers)
    validation.check_positive_int("min_workers", min_workers, error=errors.LauncherError)
    return membership.WorkerRange(min_workers, shape.num_workers)
