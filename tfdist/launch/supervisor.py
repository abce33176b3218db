"""Runs every task of a cluster as a local process and supervises them.

    cluster = make_local_cluster(JobShape(2, num_ps=1, has_chief=True))
    job = LocalJob(cluster, ["python", "train.py"], env=dict(os.environ))
    result = job.run(timeout_s=600)                 # blocks; kills on timeout
    result.outcome, result.exit_status              # JobOutcome.SUCCEEDED, 0

Every task of the cluster runs the same command (`process.TaskProcess`),
with the caller's `env` plus its own `TF_CONFIG` (written by
`ClusterConfig.to_json()`, so it always parses); its output lines are
copied to the launcher's streams prefixed with the task (`output`). All
tasks run in one private network namespace of their own where the OS
allows it (`isolation`): TensorFlow's servers listen on every interface,
and there only the job's own tasks can reach them.

Supervision (`LocalJob.run`) is a small state machine; what a task's exit
means depends on the job's `JobKind`:

    look up every task's program     # an error here starts nothing
    create the private network       # unless isolate=False (or impossible)
    start every task                 # chief, workers, ps, evaluator
    while RUNNING:
        wait for an event: a task exits | request_stop(sig) | deadline
        stop requested (signal sig)   -> INTERRUPTED, forward sig to all
        deadline passed               -> TIMED_OUT
        MULTI_WORKER:
          a task exited with code != 0  -> FAILED(task)
          every chief/worker exited 0   -> SUCCEEDED  (ps never exit by themselves)
        PARAMETER_SERVER:             # worker and ps tasks serve until stopped
          the chief exited 0            -> SUCCEEDED
          a worker exited != 0, restarted < K times -> restart it alone
          any other exit with code != 0 -> FAILED(task)
    signal every task still running (SIGTERM, or the forwarded signal)
    wait up to grace_period_s; SIGKILL the rest (a second request: at once)
    reap every task, drain its output, release the network, return JobResult

Whatever happens, including an exception or `KeyboardInterrupt` inside
`run`, no task process is left running when `run` returns or raises; a
process a task left behind in its process group that still holds the
task's output open is killed too.

POSIX only (process groups, signals). This module imports nothing from
TensorFlow.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TextIO

from tfdist import errors
from tfdist import _validation as validation
from tfdist.cluster import spec
from tfdist.launch import isolation
from tfdist.launch import job
from tfdist.launch import output as output_lib
from tfdist.launch import process as process_lib

__all__ = ["DEFAULT_GRACE_PERIOD_S", "DEFAULT_WORKER_RESTARTS", "LocalJob"]

#: Seconds a stopped task gets to exit after SIGTERM/SIGINT before SIGKILL.
DEFAULT_GRACE_PERIOD_S = 5.0

#: How many times a worker of a parameter-server job that exits non-zero is
#: restarted alone before its exit fails the job.
DEFAULT_WORKER_RESTARTS = 3

# Longest single wait of the supervision loop. Events wake it at once; the
# cap only bounds how late a signal delivered to a non-main thread (which
# cannot interrupt the main thread's wait) is noticed.
_MAX_WAIT_SLICE_S = 1.0
# How long output pumps may take to drain once every task has exited. A
# pump still open then is held by a process the task left running: its
# process group is killed, and a pump open even after that (a process that
# left the group) is abandoned; it is a daemon thread.
_DRAIN_TIMEOUT_S = 2.0


class LocalJob:
    """Runs every task of a cluster as a local process and supervises them.

    Each task runs `command` (or `command(task)`) in its own process group,
    with stdin from /dev/null and the environment `env` plus `TF_CONFIG`
    (nothing else is added). Its output lines go to `stdout`/`stderr`
    prefixed with `[<task>] `. Python tasks buffer output when it is a pipe:
    run them with `python -u` (or set PYTHONUNBUFFERED in `env`) to see lines
    as they are written.

    How the job ends depends on its kind (`JobKind`; by default a job with
    ps tasks is a parameter-server job):

    - multi-worker: it succeeds when every chief/worker task (every task,
      if there are none) has exited 0; ps and evaluator tasks still running
      then are stopped. The first task to exit non-zero fails it.
    - parameter-server: it succeeds when the chief exits 0; the worker and
      ps tasks, which serve until then, are stopped (not a failure). A
      worker that exits non-zero or is killed is restarted alone, with the
      same TF_CONFIG and port (and network), up to `worker_restarts` times,
      while the chief carries on; any other non-zero exit (the chief, a ps
      task, the evaluator, a worker past its bound) fails the job.

    See the module docstring for the state machine.

    With `isolate` (by default, where the OS allows it), all tasks run in
    one private network namespace: they reach each other at the cluster's
    127.0.0.1 addresses, and nothing outside the job reaches them, nor they
    anything outside it (no downloads, no network file systems).

    A `LocalJob` runs once. `run` blocks; `request_stop` may be called from
    any thread or a signal handler while it runs.

    Args:
      cluster: The cluster to run; its addresses are what the tasks get.
      command: The program and arguments every task runs, or a function
        returning the command for a given task.
      env: The tasks' environment (without TF_CONFIG, which is added). Pass
        `dict(os.environ)` to inherit the launcher's.
      rpc_layer: The protocol written into TF_CONFIG.
      grace_period_s: Seconds a stopped task has to exit before SIGKILL.
      kind: The job's rules; `None` means `JobKind.of(cluster)`.
      worker_restarts: For a parameter-server job, how many times each
        worker task may be restarted alone.
      isolate: Whether to run the tasks in a private network namespace:
        True requires it, False runs them on the host's network, and None
        isolates them where the OS allows it, else warns (a
        `RuntimeWarning`, once per calling line) and runs them on the
        host's network.
      preload: Modules to import once, in a template process per distinct
        `env`, from which each task whose command is `python SCRIPT ...`
        (this interpreter) is forked instead of started afresh: its start-up
        then costs a fork, not their import (`tfdist.launch.preload` says
        what else differs). `()` (the default) starts every task afresh.
      relay_signals: Whether each task's command is a remote shell running
        `tfdist.launch.remote_task` on another host (`remote.RemoteShell`):
        signals other than SIGKILL are then written to its standard input
        for the host end to deliver, not sent to the local process.
      stdout: Where task stdout lines go; `None` means `sys.stdout` at the
        time `run` starts.
      stderr: Where task stderr lines go; `None` means `sys.stderr`.

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If `command` is empty, `worker_restarts` < 0, or a
        parameter-server job has no chief.
      ConfigError: If `grace_period_s` is not a positive number.

    Example:
      >>> job = LocalJob(make_local_cluster(JobShape(2)),
      ...                ["python", "-u", "train.py"], env=dict(os.environ))
      >>> result = job.run(timeout_s=300)
      >>> result.exit_status
      0
    """

    def __init__(
        self,
        cluster: spec.ClusterSpec,
        command: Sequence[str] | Callable[[spec.TaskSpec], Sequence[str]],
        *,
        env: Mapping[str, str],
        rpc_layer: str = spec.DEFAULT_RPC_LAYER,
        grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
        kind: job.JobKind | None = None,
        worker_restarts: int = DEFAULT_WORKER_RESTARTS,
        isolate: bool | None = None,
        preload: Sequence[str] = (),
        relay_signals: bool = False,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        if not isinstance(cluster, spec.ClusterSpec):
            raise TypeError(
                f"cluster must be a ClusterSpec; received cluster={cluster!r} "
                f"of type {type(cluster).__name__}. Build one with "
                "make_local_cluster()."
            )
        if not isinstance(env, Mapping):
            raise TypeError(
                f"env must be a mapping of str to str; received type "
                f"{type(env).__name__}. Pass dict(os.environ) to inherit."
            )
        self._configs = tuple(
            spec.ClusterConfig(cluster=cluster, task=task, rpc_layer=rpc_layer)
            for task in cluster.tasks()
        )
        if callable(command):
            self._commands = tuple(
                job.check_command(command(config.task))
                for config in self._configs
                if config.task is not None
            )
        else:
            argv = job.check_command(command)
            self._commands = tuple(argv for _ in self._configs)
        self._env = dict(env)
        if kind is not None and not isinstance(kind, job.JobKind):
            raise TypeError(
                f"kind must be a JobKind or None; received kind={kind!r} of "
                f"type {type(kind).__name__}."
            )
        self._kind = job.JobKind.of(cluster) if kind is None else kind
        if (
            self._kind is job.JobKind.PARAMETER_SERVER
            and "chief" not in cluster.job_names
        ):
            raise errors.LauncherError(
                "a parameter-server job needs a chief, which runs the "
                "training script (TensorFlow's ParameterServerStrategy "
                "coordinates from it); received a cluster of "
                f"{', '.join(cluster.job_names)}. Add a chief task "
                "(JobShape(has_chief=True), --chief), or pass "
                "kind=JobKind.MULTI_WORKER for a job whose workers all run "
                "the script to its end."
            )
        self._worker_restarts = validation.check_non_negative_int(
            "worker_restarts", worker_restarts, error=errors.LauncherError
        )
        self._grace_period_s = validation.check_positive_number(
            "grace_period_s", grace_period_s
        )
        if isolate is not None and not isinstance(isolate, bool):
            raise TypeError(
                f"isolate must be True, False or None; received "
                f"isolate={isolate!r} of type {type(isolate).__name__}."
            )
        self._isolate = isolate
        if isinstance(preload, str) or not all(
            isinstance(name, str) and name for name in preload
        ):
            raise TypeError(
                f"preload must be a sequence of module names; received "
                f"preload={preload!r}. Pass a tuple, as in "
                "preload=('tensorflow',)."
            )
        self._preload = tuple(preload)
        self._relay_signals = bool(relay_signals)
        self._stdout = stdout
        self._stderr = stderr
        self._events: queue.SimpleQueue[process_lib.Event] = queue.SimpleQueue()
        self._has_run = False
        self._run_lock = threading.Lock()

    @property
    def cluster(self) -> spec.ClusterSpec:
        """The cluster the job runs."""
        cluster = self._configs[0].cluster
        assert cluster is not None  # Built from a ClusterSpec.
        return cluster

    @property
    def configs(self) -> tuple[spec.ClusterConfig, ...]:
        """Each task's TF_CONFIG, in `ClusterSpec.tasks()` order."""
        return self._configs

    def request_stop(self, signal_number: int = signal.SIGTERM) -> None:
        """Asks `run` to stop every task by sending it `signal_number`.

        Safe to call from a signal handler and from any thread, before or
        during `run`; `run` then returns `JobOutcome.INTERRUPTED` (unless it
        had already decided another outcome). A second request while tasks
        are in their grace period kills them at once.

        Args:
          signal_number: The signal forwarded to every running task.
        """
        # SimpleQueue.put is reentrant: safe inside a signal handler.
        self._events.put(("stop", -1, int(signal_number)))

    def run(self, timeout_s: float | None = None) -> job.JobResult:
        """Starts every task and blocks until the job ends.

        Args:
          timeout_s: Limit on the whole job in seconds, or `None` for none.

        Returns:
          The outcome and every task's exit code. On return, every task
          process has exited and been reaped, and its output is written.

        Raises:
          RuntimeError: If the job has already run.
          ConfigError: If `timeout_s` is not a positive number.
          LauncherError: If a task's program is not found (no task is
            started then), `isolate=True` but the OS does not allow it, or
            a task cannot be started (the tasks already started are killed
            first).
        """
        if timeout_s is not None:
            timeout_s = validation.check_positive_number("timeout_s", timeout_s)
        with self._run_lock:
            if self._has_run:
                raise RuntimeError(
                    "LocalJob.run() was called twice; a LocalJob runs once. "
                    "Create a new LocalJob (with make_local_cluster() for "
                    "fresh ports) to run the job again."
                )
            self._has_run = True
        programs = [
            _find_program(config, command, self._env)
            for config, command in zip(self._configs, self._commands)
        ]
        is_isolated = isolation.should_isolate(
            self._isolate, report=_warn_not_isolated
        )
        output = output_lib.TaskOutput(
            self._stdout if self._stdout is not None else sys.stdout,
            self._stderr if self._stderr is not None else sys.stderr,
        )
        started_s = time.monotonic()
        deadline_s = None if timeout_s is None else started_s + timeout_s
        tasks = [
            process_lib.TaskProcess(index, config, output, self._events)
            for index, config in enumerate(self._configs)
        ]
        network = isolation.PrivateNetwork.create() if is_isolated else None
        # Unisolated tasks on the host's network: the user was told (or
        # asked for it); the tasks need not say it again.
        task_env = self._env if is_isolated else dict(
            self._env, **{isolation.NOTICE_GIVEN_ENV: "1"})
        try:
            for task in tasks:
                task.start(
                    programs[task.index],
                    self._commands[task.index],
                    task_env,
                    network=network,
                    preload=self._preload,
                    relay_signals=self._relay_signals,
                )
            outcome, failed, signal_number = self._supervise(
                tasks, deadline_s, output
            )
            decided_after_s = time.monotonic() - started_s
            if outcome is not job.JobOutcome.SUCCEEDED or any(
                t.is_running for t in tasks
            ):
                self._stop(
                    tasks,
                    signal_number
                    if signal_number is not None
                    else signal.SIGTERM,
                )
        finally:
            _kill_and_reap(tasks)
            if network is not None:
                network.close()
        return job.JobResult(
            outcome=outcome,
            tasks=tuple(t.result() for t in tasks),
            kind=self._kind,
            failed_task=failed,
            signal_number=signal_number,
            timeout_s=timeout_s,
            elapsed_s=time.monotonic() - started_s,
            decided_after_s=decided_after_s,
            is_isolated=is_isolated,
        )

    def _supervise(
        self,
        tasks: list[process_lib.TaskProcess],
        deadline_s: float | None,
        output: output_lib.TaskOutput,
    ) -> _Decision:
        primary = [t for t in tasks if job.is_primary(t.task)] or tasks
        # A task that exited 143 saved its state at a step (tfdist.elastic);
        # its peers are saving at the same step: they get the grace period
        # to finish before being stopped, so a slower chief is not killed
        # in the middle of writing the checkpoint.
        preempted: spec.TaskSpec | None = None
        preempted_until_s = float("inf")
        while True:
            wait_s = min(_MAX_WAIT_SLICE_S, preempted_until_s - time.monotonic())
            if deadline_s is not None:
                wait_s = min(wait_s, deadline_s - time.monotonic())
                if deadline_s - time.monotonic() <= 0:
                    return job.JobOutcome.TIMED_OUT, None, None
            if preempted is not None and wait_s <= 0:
                return job.JobOutcome.FAILED, preempted, None
            try:
                kind, index, value = self._events.get(timeout=max(wait_s, 0.0))
            except queue.Empty:
                continue
            if kind == "stop":
                return job.JobOutcome.INTERRUPTED, None, value
            task = tasks[index]
            task.exit_code = value
            if self._kind is job.JobKind.PARAMETER_SERVER:
                decision = self._on_parameter_server_exit(task, output)
                if decision is not None:
                    return decision
            elif value == errors.PREEMPTED_EXIT_CODE:
                if preempted is None:
                    preempted = task.task
                    preempted_until_s = time.monotonic() + self._grace_period_s
                if all(not t.is_running for t in primary):
                    return job.JobOutcome.FAILED, preempted, None
            elif value != 0:
                return job.JobOutcome.FAILED, preempted or task.task, None
            elif all(not t.is_running for t in primary):
                if preempted is not None:
                    return job.JobOutcome.FAILED, preempted, None
                return job.JobOutcome.SUCCEEDED, None, None

    def _on_parameter_server_exit(
        self, task: process_lib.TaskProcess, output: output_lib.TaskOutput
    ) -> _Decision | None:
        """Applies a parameter-server job's rules to an exit; None: go on."""
        exit_code = task.exit_code
        if task.task.task_type == "chief":
            if exit_code == 0:
                return job.JobOutcome.SUCCEEDED, None, None
            return job.JobOutcome.FAILED, task.task, None
        if exit_code == 0:  # It served and left; the chief decides the rest.
            return None
        if (
            task.task.task_type == "worker"
            and task.restarts < self._worker_restarts
        ):
            how = task.result().describe()
            output.write_line(
                "stderr",
                f"tfdist-launch: task {task.task.name} {how}; restarting it "
                f"alone ({task.restarts + 1}/{self._worker_restarts}) with "
                "the same TF_CONFIG and port; the chief carries on.",
            )
            task.restart()
            return None
        return job.JobOutcome.FAILED, task.task, None

    def _stop(
        self, tasks: list[process_lib.TaskProcess], signal_number: int
    ) -> None:
        """Signals running tasks, waits out the grace period, then kills."""
        is_urgent = False
        while True:  # Exits already reported are not stopped tasks.
            try:
                kind, index, value = self._events.get_nowait()
            except queue.Empty:
                break
            if kind == "stop":
                is_urgent = True
            else:
                tasks[index].exit_code = value
        running = [t for t in tasks if t.is_running]
        for task in running:
            task.was_stopped = task.signal_group(signal_number)
        deadline_s = time.monotonic() + self._grace_period_s
        while not is_urgent and any(t.is_running for t in running):
            wait_s = deadline_s - time.monotonic()
            if wait_s <= 0:
                break
            try:
                kind, index, value = self._events.get(timeout=wait_s)
            except queue.Empty:
                break
            if kind == "stop":  # Asked again: do not wait any longer.
                break
            tasks[index].exit_code = value
        for task in running:
            if task.is_running and task.signal_group(signal.SIGKILL):
                task.was_stopped = task.was_killed = True


# What supervision decided: the outcome, the task that failed the job (for
# FAILED), the signal to forward (for INTERRUPTED).
_Decision = tuple[job.JobOutcome, spec.TaskSpec | None, int | None]


def _find_program(
    config: spec.ClusterConfig, command: Sequence[str], env: Mapping[str, str]
) -> str:
    try:
        return process_lib.find_program(command, env)
    except errors.LauncherError as e:
        assert config.task is not None  # LocalJob builds one per task.
        raise errors.LauncherError(
            f"cannot start task {config.task.name}: {e}"
        ) from None


def _warn_not_isolated(notice: str) -> None:
    # stacklevel 4: the caller of LocalJob.run (through should_isolate and
    # run), so the default warnings filter shows it once per calling line.
    warnings.warn(notice, RuntimeWarning, stacklevel=4)


def _kill_and_reap(tasks: Sequence[process_lib.TaskProcess]) -> None:
    """SIGKILLs what still runs, reaps every task, drains its output."""
    for task in tasks:
        if task.is_running:
            task.signal_group(signal.SIGKILL)
    for task in tasks:
        task.reap()
    drain_deadline_s = time.monotonic() + _DRAIN_TIMEOUT_S
    for task in tasks:
        task.drain(drain_deadline_s, wait_s=_DRAIN_TIMEOUT_S)
