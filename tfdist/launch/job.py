"""What a job is and how it ended: `JobShape`, `JobKind` and the results.

    shape = JobShape(2, num_ps=2, has_chief=True)
    [t.name for t in shape.tasks()]   # chief:0, worker:0, worker:1, ps:0, ps:1
    shape.kind                        # JobKind.PARAMETER_SERVER

`JobShape` is the one description of a job's tasks that every launcher
entry point takes (local ports, real hosts, Kubeflow). `JobKind` says what
ends a job and which failures it survives; `LocalJob` reports each run as a
`JobResult` of `TaskResult`s.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from collections.abc import Sequence

from tfdist import errors
from tfdist import _validation as validation
from tfdist.cluster import spec

__all__ = [
    "JobKind",
    "JobOutcome",
    "JobResult",
    "JobShape",
    "TaskResult",
    "check_command",
]

# Exit statuses of `JobResult.exit_status`, as the shell spells them.
_EXIT_FAILED = 1
_EXIT_TIMED_OUT = 124  # As timeout(1).
_EXIT_SIGNAL_BASE = 128  # 128 + N: stopped by signal N.
# The tasks whose exits end a multi-worker job; the others are then stopped.
_PRIMARY_TASK_TYPES = ("chief", "worker")


class JobKind(enum.Enum):
    """What ends a job, and which task failures it survives.

    In both kinds a timeout or a stop request ends the job, and every task
    still running when the job ends is stopped (SIGTERM, then SIGKILL after
    the grace period); being stopped is not a failure.
    """

    #: Every chief/worker task runs the script to its end (TF's
    #: MultiWorkerMirroredStrategy, or `tfdist.testing.run_local_cluster`).
    #: The job succeeds when every chief/worker task (every task, if there
    #: are none) has exited 0; ps and evaluator tasks still running then are
    #: stopped. The first task to exit non-zero fails the job.
    MULTI_WORKER = "multi_worker"
    #: The chief runs the script; worker and ps tasks serve until the job
    #: ends (a parameter-server strategy starts their servers). The job
    #: succeeds when the chief exits 0. A worker that exits non-zero (or is
    #: killed) is restarted alone, with the same TF_CONFIG and port, while
    #: the chief carries on, up to a bound per worker; any other task that
    #: exits non-zero, or a worker past its bound, fails the job.
    PARAMETER_SERVER = "parameter_server"

    @classmethod
    def of(cls, cluster: spec.ClusterSpec) -> JobKind:
        """`PARAMETER_SERVER` if `cluster` has ps tasks, else `MULTI_WORKER`."""
        return cls.PARAMETER_SERVER if cluster.num_ps else cls.MULTI_WORKER


@dataclasses.dataclass(frozen=True)
class JobShape:
    """The tasks of a job: how many workers and ps, whether a chief/evaluator.

    Attributes:
      num_workers: Worker tasks, >= 1.
      num_ps: Parameter-server tasks, >= 0. A job with ps tasks is a
        parameter-server job (`kind`), which `LocalJob` runs only with a
        chief.
      has_chief: Whether the job has a `chief` task.
      has_evaluator: Whether the job has an `evaluator` task.

    Raises:
      TypeError: If a count is not an int or a flag not a bool.
      LauncherError: If `num_workers` < 1 or `num_ps` < 0.

    Example:
      >>> shape = JobShape(2, num_ps=1, has_chief=True)
      >>> [t.name for t in shape.tasks()]
      ['chief:0', 'worker:0', 'worker:1', 'ps:0']
    """

    num_workers: int
    _: dataclasses.KW_ONLY
    num_ps: int = 0
    has_chief: bool = False
    has_evaluator: bool = False

    def __post_init__(self) -> None:
        validation.check_positive_int(
            "num_workers", self.num_workers, error=errors.LauncherError
        )
        validation.check_non_negative_int(
            "num_ps", self.num_ps, error=errors.LauncherError
        )
        for name in ("has_chief", "has_evaluator"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(
                    f"{name} must be a bool; received {name}={value!r} of "
                    f"type {type(value).__name__}."
                )

    @property
    def kind(self) -> JobKind:
        """`PARAMETER_SERVER` if the job has ps tasks, else `MULTI_WORKER`."""
        return JobKind.PARAMETER_SERVER if self.num_ps else JobKind.MULTI_WORKER

    @property
    def num_tasks(self) -> int:
        """How many tasks (processes) the job has."""
        return (
            self.num_workers
            + self.num_ps
            + int(self.has_chief)
            + int(self.has_evaluator)
        )

    def tasks(self) -> tuple[spec.TaskSpec, ...]:
        """The tasks in host-assignment order: chief, workers, ps, evaluator."""
        tasks = [spec.TaskSpec("chief", 0)] if self.has_chief else []
        tasks += [spec.TaskSpec("worker", i) for i in range(self.num_workers)]
        tasks += [spec.TaskSpec("ps", i) for i in range(self.num_ps)]
        if self.has_evaluator:
            tasks.append(spec.TaskSpec("evaluator", 0))
        return tuple(tasks)

    def cluster_spec(self, addresses: Sequence[str]) -> spec.ClusterSpec:
        """Returns the cluster giving `tasks()` these addresses, in order.

        Raises:
          ClusterConfigError: If an address is invalid or repeated.
          ValueError: If there is not one address per task.
        """
        jobs: dict[str, list[str]] = {}
        for task, address in zip(self.tasks(), addresses, strict=True):
            jobs.setdefault(task.task_type, []).append(address)
        return spec.ClusterSpec(jobs)


def check_command(command: object) -> tuple[str, ...]:
    """Returns `command` as a tuple if it is a non-empty sequence of str.

    Raises:
      TypeError: If `command` is a str or not a sequence of str.
      LauncherError: If `command` is empty.
    """
    if isinstance(command, str) or not isinstance(command, Sequence):
        raise TypeError(
            f"command must be a sequence of str, the program and its "
            f"arguments; received command={command!r} of type "
            f"{type(command).__name__}. Split it, as in ['python', 'train.py']."
        )
    if not command:
        raise errors.LauncherError(
            "command=[] is empty; expected the program to run and its "
            "arguments, as in ['python', 'train.py']. Pass the command."
        )
    for index, arg in enumerate(command):
        if not isinstance(arg, str):
            raise TypeError(
                f"command[{index}]={arg!r} must be a str; received type "
                f"{type(arg).__name__}."
            )
    return tuple(command)


class JobOutcome(enum.Enum):
    """How a `LocalJob` ended."""

    #: Every chief/worker task exited 0 (multi-worker jobs), or the chief
    #: exited 0 (parameter-server jobs).
    SUCCEEDED = "succeeded"
    #: A task exited with a non-zero code (or was killed by a signal) and
    #: the job's kind does not survive that (see `JobKind`).
    FAILED = "failed"
    #: The job ran past its `timeout_s`.
    TIMED_OUT = "timed_out"
    #: `LocalJob.request_stop` was called, typically by a signal handler.
    INTERRUPTED = "interrupted"


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """How one task ended.

    Attributes:
      task: The task.
      exit_code: The exit status of its last process, as `subprocess`
        reports it: a negative value `-N` means it was killed by signal `N`.
      was_stopped: Whether the launcher signalled it before it exited (to
        end the job, forward a signal, or enforce the timeout).
      was_killed: Whether it ignored that signal for the grace period and
        was killed with SIGKILL.
      restarts: How many times the task was restarted alone (worker tasks
        of a parameter-server job); 0 otherwise.
    """

    task: spec.TaskSpec
    exit_code: int
    was_stopped: bool = False
    was_killed: bool = False
    restarts: int = 0

    @property
    def succeeded(self) -> bool:
        """Whether the task's last process exited with code 0."""
        return self.exit_code == 0

    def describe(self) -> str:
        """Returns e.g. `"exited with code 3"` or `"was killed by SIGKILL"`."""
        if self.exit_code < 0:
            how = f"was killed by {_signal_name(-self.exit_code)}"
        else:
            how = f"exited with code {self.exit_code}"
        if self.restarts:
            how += f" after {self.restarts} restart(s)"
        return how


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobResult:
    """How a `LocalJob` ended, task by task.

    Attributes:
      outcome: Why supervision ended.
      tasks: One result per task, in `ClusterSpec.tasks()` order.
      kind: The rules the job ran under.
      failed_task: For `FAILED`, the task whose exit failed the job.
      signal_number: For `INTERRUPTED`, the signal passed to `request_stop`.
      timeout_s: The time limit the job ran under, or `None`.
      elapsed_s: Seconds from starting the first task to reaping the last.
      decided_after_s: Seconds from starting the first task to the exit,
        timeout or stop request that decided the outcome (the tasks still
        running were stopped after it).
      is_isolated: Whether the tasks ran in a private network namespace.
      error: For `FAILED`, the tfdist error that names why when the
        launcher decided it (an elastic job below its minimum:
        `TooFewWorkersError`); raise it to fail a program the same way.
        None otherwise (a task's own exit decided it).
    """

    outcome: JobOutcome
    tasks: tuple[TaskResult, ...]
    kind: JobKind = JobKind.MULTI_WORKER
    failed_task: spec.TaskSpec | None = None
    signal_number: int | None = None
    timeout_s: float | None = None
    elapsed_s: float = 0.0
    decided_after_s: float = 0.0
    is_isolated: bool = False
    error: errors.TfdistError | None = None

    @property
    def succeeded(self) -> bool:
        """Whether the outcome is `SUCCEEDED`."""
        return self.outcome is JobOutcome.SUCCEEDED

    @property
    def exit_status(self) -> int:
        """The status a launcher process exits with for this result.

        0 for `SUCCEEDED`, 1 for `FAILED`, 124 for `TIMED_OUT` (as
        `timeout(1)`), and 128 + N for `INTERRUPTED` by signal N (130 for
        SIGINT), as a shell reports a process killed by that signal.
        """
        if self.outcome is JobOutcome.SUCCEEDED:
            return 0
        if self.outcome is JobOutcome.TIMED_OUT:
            return _EXIT_TIMED_OUT
        if self.outcome is JobOutcome.INTERRUPTED:
            return _EXIT_SIGNAL_BASE + (self.signal_number or signal.SIGTERM)
        return _EXIT_FAILED

    def task_result(self, task: spec.TaskSpec | str) -> TaskResult:
        """Returns the result of `task` (a `TaskSpec` or a name `"worker:1"`).

        Raises:
          KeyError: If the job had no such task.
        """
        name = task.name if isinstance(task, spec.TaskSpec) else task
        for result in self.tasks:
            if result.task.name == name:
                return result
        raise KeyError(
            f"task={name!r} is not a task of this job, whose tasks are "
            f"{', '.join(r.task.name for r in self.tasks)}."
        )

    @property
    def stopped_tasks(self) -> tuple[TaskResult, ...]:
        """The tasks the launcher had to signal, in task order."""
        return tuple(r for r in self.tasks if r.was_stopped)

    def describe(self) -> str:
        """Returns a one-sentence summary naming the tasks involved.

        Example:
          "task worker:1 exited with code 3; stopped the other 2 task(s)."
        """
        stopped = self.stopped_tasks
        killed = [r for r in stopped if r.was_killed]
        killed_note = (
            f" ({_names(killed)} ignored it and "
            f"{'was' if len(killed) == 1 else 'were'} killed)"
            if killed
            else ""
        )
        if self.outcome is JobOutcome.FAILED and self.error is not None:
            return f"{type(self.error).__name__}: {self.error}"
        if self.outcome is JobOutcome.FAILED and self.failed_task is not None:
            failed = self.task_result(self.failed_task)
            if stopped:
                tail = (
                    f"stopped the other {len(stopped)} task(s): "
                    f"{_names(stopped)}{killed_note}."
                )
            else:
                tail = "no other task was still running."
            return f"task {failed.task.name} {failed.describe()}; {tail}"
        if self.outcome is JobOutcome.TIMED_OUT:
            return (
                f"the job ran past timeout_s={self.timeout_s:g}; stopped "
                f"{len(stopped)} running task(s): {_names(stopped)}"
                f"{killed_note}. Raise the timeout, or look at the tasks' "
                "output above for where they were stuck."
            )
        if self.outcome is JobOutcome.INTERRUPTED:
            return (
                f"received {_signal_name(self.signal_number)}; forwarded it "
                f"to {len(stopped)} running task(s): {_names(stopped) or '-'}"
                f"{killed_note}."
            )
        restarted = [r for r in self.tasks if r.restarts]
        restarted_note = (
            "; restarted "
            + ", ".join(
                f"{r.task.name} {r.restarts} time(s)" for r in restarted
            )
            if restarted
            else ""
        )
        if self.kind is JobKind.PARAMETER_SERVER:
            ended = (
                f"; stopped the {len(stopped)} task(s) still serving: "
                f"{_names(stopped)}{killed_note}"
                if stopped
                else ""
            )
            return (
                f"the chief exited 0 in {self.elapsed_s:.1f} s{ended}"
                f"{restarted_note}."
            )
        primary = [
            r for r in self.tasks if r.task.task_type in _PRIMARY_TASK_TYPES
        ]
        ended = (
            f"; stopped {len(stopped)} ps/evaluator task(s): "
            f"{_names(stopped)}{killed_note}"
            if stopped
            else ""
        )
        return (
            f"all {len(primary) or len(self.tasks)} chief/worker task(s) "
            f"exited 0 in {self.elapsed_s:.1f} s{ended}."
        )


def is_primary(task: spec.TaskSpec) -> bool:
    """Whether `task`'s exit can end a multi-worker job (chief or worker)."""
    return task.task_type in _PRIMARY_TASK_TYPES


def _names(results: Sequence[TaskResult]) -> str:
    return ", ".join(r.task.name for r in results)


def _signal_name(signal_number: int | None) -> str:
    if signal_number is None:
        return "a stop request"
    try:
        return signal.Signals(signal_number).name
    except ValueError:
        return f"signal {signal_number}"
