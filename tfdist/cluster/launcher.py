"""Runs a TF_CONFIG cluster as local processes on 127.0.0.1 and supervises it.

    cluster = make_local_cluster(2, num_ps=1)      # free 127.0.0.1 ports
    job = LocalJob(cluster, ["python", "train.py"], env=dict(os.environ))
    result = job.run(timeout_s=600)                 # blocks; kills on timeout
    result.outcome, result.exit_status              # JobOutcome.SUCCEEDED, 0

Every task of the cluster runs the same command, in its own process group,
with the caller's `env` plus its own `TF_CONFIG` (written by
`ClusterConfig.to_json()`, so it always parses). Each line a task writes is
copied to the launcher's stdout or stderr, prefixed with the task
(`[worker:1] ...`); lines are written whole, never interleaved.

Supervision (`LocalJob.run`) is a small state machine:

    start every task                 # chief, workers, ps, evaluator
    while RUNNING:
        wait for an event: a task exits | request_stop(sig) | deadline
        stop requested (signal sig)   -> INTERRUPTED, forward sig to all
        deadline passed               -> TIMED_OUT
        a task exited with code != 0  -> FAILED(task)
        every chief/worker exited 0   -> SUCCEEDED  (ps never exit by themselves)
    signal every task still running (SIGTERM, or the forwarded signal)
    wait up to grace_period_s; SIGKILL the rest (a second request: at once)
    reap every task, drain its output, return JobResult

Whatever happens, including an exception or `KeyboardInterrupt` inside
`run`, no task process is left running when `run` returns or raises; a
process a task left behind in its process group that still holds the
task's output open is killed too.

`run_local_job` adds what the `tfdist-launch` command line offers on top:
restarting the whole job after a failure (`restarts`), one timeout for all
attempts, and forwarding SIGINT/SIGTERM. `cluster_from_hosts` and
`tfjob_manifest` describe the same job for a real cluster.

Ports: `make_local_cluster` takes candidates from `portpicker`, skips any
already handed out in this cluster, and keeps a port only if it can bind it
on 127.0.0.1 itself (no `SO_REUSEADDR`), holding every chosen port bound
until all are chosen. Between that check and a task's server binding the
port, another process can still take it: that race cannot be closed from
outside the task; a task that loses it fails at start-up, and `restarts`
relaunches the job on fresh ports.

POSIX only (process groups, signals). This module imports nothing from
TensorFlow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import IO
from typing import TextIO

import portpicker  # type: ignore[import-untyped]

from tfdist import errors
from tfdist._internal import validation
from tfdist.cluster import spec
from tfdist.cluster import tf_config

__all__ = [
    "DEFAULT_GRACE_PERIOD_S",
    "DEFAULT_TFJOB_IMAGE",
    "DEFAULT_TFJOB_NAME",
    "JobOutcome",
    "JobResult",
    "LocalJob",
    "TaskResult",
    "cluster_from_hosts",
    "make_local_cluster",
    "run_local_job",
    "tfjob_manifest",
]

#: Seconds a stopped task gets to exit after SIGTERM/SIGINT before SIGKILL.
DEFAULT_GRACE_PERIOD_S = 5.0

#: Container image `tfjob_manifest` uses unless told otherwise. It has
#: TensorFlow but neither tfdist nor your script: pass your own image.
DEFAULT_TFJOB_IMAGE = "tensorflow/tensorflow:latest"

#: TFJob name `tfjob_manifest` uses unless told otherwise.
DEFAULT_TFJOB_NAME = "tfdist-job"

#: The only host local clusters use: nothing listens beyond loopback.
LOCAL_HOST = "127.0.0.1"

# Candidate ports tried per port before giving up.
_MAX_PORT_ATTEMPTS = 50
# Longest single wait of the supervision loop. Events wake it at once; the
# cap only bounds how late a signal delivered to a non-main thread (which
# cannot interrupt the main thread's wait) is noticed.
_MAX_WAIT_SLICE_S = 1.0
# How long output pumps may take to drain once every task has exited. A
# pump still open then is held by a process the task left running: its
# process group is killed, and a pump open even after that (a process that
# left the group) is abandoned; it is a daemon thread.
_DRAIN_TIMEOUT_S = 2.0
# Exit statuses of `JobResult.exit_status`, as the shell spells them.
_EXIT_FAILED = 1
_EXIT_TIMED_OUT = 124  # As timeout(1).
_EXIT_SIGNAL_BASE = 128  # 128 + N: stopped by signal N.
# Jobs whose exit ends a job; ps and evaluator are stopped once these finish.
_PRIMARY_TASK_TYPES = ("chief", "worker")
# A Kubernetes object name that also works in the Services the operator
# makes from it (RFC 1035 label: starts with a letter, at most 63).
_K8S_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_K8S_NAME_MAX_CHARS = 63
# Kubeflow's replica type for each TF_CONFIG job.
_TFJOB_REPLICA_TYPES = {
    "chief": "Chief",
    "worker": "Worker",
    "ps": "PS",
    "evaluator": "Evaluator",
}


class JobOutcome(enum.Enum):
    """How a `LocalJob` ended."""

    #: Every chief/worker task exited 0.
    SUCCEEDED = "succeeded"
    #: A task exited with a non-zero code (or was killed by a signal).
    FAILED = "failed"
    #: The job ran past its `timeout_s`.
    TIMED_OUT = "timed_out"
    #: `LocalJob.request_stop` was called, typically by a signal handler.
    INTERRUPTED = "interrupted"


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """How one task process ended.

    Attributes:
      task: The task.
      exit_code: The process's exit status, as `subprocess` reports it: a
        negative value `-N` means it was killed by signal `N`.
      was_stopped: Whether the launcher signalled it before it exited (to
        end the job, forward a signal, or enforce the timeout).
      was_killed: Whether it ignored that signal for the grace period and
        was killed with SIGKILL.
    """

    task: spec.TaskSpec
    exit_code: int
    was_stopped: bool = False
    was_killed: bool = False

    @property
    def succeeded(self) -> bool:
        """Whether the task exited with code 0."""
        return self.exit_code == 0

    def describe(self) -> str:
        """Returns e.g. `"exited with code 3"` or `"was killed by SIGKILL"`."""
        return _describe_exit_code(self.exit_code)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobResult:
    """How a `LocalJob` ended, task by task.

    Attributes:
      outcome: Why supervision ended.
      tasks: One result per task, in `ClusterSpec.tasks()` order.
      failed_task: For `FAILED`, the first task that exited non-zero.
      signal_number: For `INTERRUPTED`, the signal passed to `request_stop`.
      timeout_s: The time limit the job ran under, or `None`.
      elapsed_s: Seconds from starting the first task to reaping the last.
    """

    outcome: JobOutcome
    tasks: tuple[TaskResult, ...]
    failed_task: spec.TaskSpec | None = None
    signal_number: int | None = None
    timeout_s: float | None = None
    elapsed_s: float = 0.0

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


def _names(results: Sequence[TaskResult]) -> str:
    return ", ".join(r.task.name for r in results)


def _signal_name(signal_number: int | None) -> str:
    if signal_number is None:
        return "a stop request"
    try:
        return signal.Signals(signal_number).name
    except ValueError:
        return f"signal {signal_number}"


def _describe_exit_code(exit_code: int) -> str:
    if exit_code < 0:
        return f"was killed by {_signal_name(-exit_code)}"
    return f"exited with code {exit_code}"


# --------------------------------------------------------------------------
# Clusters.


def _check_shape(
    num_workers: object,
    num_ps: object,
    has_chief: object,
    has_evaluator: object,
) -> tuple[int, int, bool, bool]:
    """Validates a job's task counts; returns them typed."""
    workers = validation.check_positive_int(
        "num_workers", num_workers, error=errors.LauncherError
    )
    ps = validation.check_non_negative_int(
        "num_ps", num_ps, error=errors.LauncherError
    )
    for name, value in (
        ("has_chief", has_chief),
        ("has_evaluator", has_evaluator),
    ):
        if not isinstance(value, bool):
            raise TypeError(
                f"{name} must be a bool; received {name}={value!r} of type "
                f"{type(value).__name__}."
            )
    return workers, ps, bool(has_chief), bool(has_evaluator)


def _task_slots(
    num_workers: int, num_ps: int, has_chief: bool, has_evaluator: bool
) -> list[spec.TaskSpec]:
    """The job's tasks in host-assignment order: chief, workers, ps, eval."""
    tasks = [spec.TaskSpec("chief", 0)] if has_chief else []
    tasks += [spec.TaskSpec("worker", i) for i in range(num_workers)]
    tasks += [spec.TaskSpec("ps", i) for i in range(num_ps)]
    if has_evaluator:
        tasks.append(spec.TaskSpec("evaluator", 0))
    return tasks


def _cluster_from_addresses(
    tasks: Sequence[spec.TaskSpec], addresses: Sequence[str]
) -> spec.ClusterSpec:
    jobs: dict[str, list[str]] = {}
    for task, address in zip(tasks, addresses, strict=True):
        jobs.setdefault(task.task_type, []).append(address)
    return spec.ClusterSpec(jobs)


def make_local_cluster(
    num_workers: int,
    *,
    num_ps: int = 0,
    has_chief: bool = False,
    has_evaluator: bool = False,
) -> spec.ClusterSpec:
    """Returns a cluster whose tasks all listen on free 127.0.0.1 ports.

    Every port is distinct, was free when chosen (this function bound it on
    127.0.0.1 itself, without `SO_REUSEADDR`), and is released again before
    returning, for the task to bind. See the module docstring for the race
    this cannot close.

    Args:
      num_workers: Worker tasks, >= 1.
      num_ps: Parameter-server tasks, >= 0.
      has_chief: Whether to add a `chief` task.
      has_evaluator: Whether to add an `evaluator` task.

    Returns:
      A `ClusterSpec` with addresses `127.0.0.1:<port>`.

    Raises:
      TypeError: If a count is not an int or a flag not a bool.
      LauncherError: If `num_workers` < 1 or `num_ps` < 0, or no free port
        can be found.

    Example:
      >>> cluster = make_local_cluster(2, num_ps=1)
      >>> [t.name for t in cluster.tasks()]
      ['worker:0', 'worker:1', 'ps:0']
    """
    shape = _check_shape(num_workers, num_ps, has_chief, has_evaluator)
    tasks = _task_slots(*shape)
    ports = _pick_free_ports(len(tasks))
    return _cluster_from_addresses(
        tasks, [f"{LOCAL_HOST}:{port}" for port in ports]
    )


def _pick_free_ports(count: int) -> tuple[int, ...]:
    """Returns `count` distinct ports, each bindable on 127.0.0.1 just now."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(count):
            for _ in range(_MAX_PORT_ATTEMPTS):
                try:
                    port = portpicker.pick_unused_port()
                except portpicker.NoFreePortFoundError:
                    continue
                if port in ports:
                    continue
                sock = _bind_loopback(port)
                if sock is not None:
                    held.append(sock)
                    ports.append(port)
                    break
            else:
                raise errors.LauncherError(
                    f"found only {len(ports)} of the {count} free "
                    f"{LOCAL_HOST} ports needed after {_MAX_PORT_ATTEMPTS} "
                    "tries for the next; expected the ephemeral port range to "
                    "have room. Stop stale local clusters (`ss -ltnp`), or "
                    "run fewer tasks."
                )
    finally:
        for sock in held:
            sock.close()
    return tuple(ports)


def _bind_loopback(port: int) -> socket.socket | None:
    """Binds `port` on 127.0.0.1 (no address reuse); `None` if it is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOCAL_HOST, port))
    except OSError:
        sock.close()
        return None
    return sock


def cluster_from_hosts(
    hosts: Sequence[str],
    *,
    num_workers: int,
    num_ps: int = 0,
    has_chief: bool = False,
    has_evaluator: bool = False,
) -> spec.ClusterSpec:
    """Returns the cluster of a real job whose tasks run on `hosts`.

    Hosts are assigned in order: the chief (if any), the workers, the ps
    tasks, then the evaluator (if any).

    Args:
      hosts: One `host:port` per task, such as `["10.0.0.1:2222", ...]`.
      num_workers: Worker tasks, >= 1.
      num_ps: Parameter-server tasks, >= 0.
      has_chief: Whether the job has a `chief` task.
      has_evaluator: Whether the job has an `evaluator` task.

    Returns:
      The `ClusterSpec` listing `hosts` in their jobs.

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If a count is out of range, the number of hosts is not
        the number of tasks (the message gives both), an entry is not a
        valid `host:port`, or two entries are the same address.

    Example:
      >>> cluster_from_hosts(["a:1", "b:1", "c:1"], num_workers=2,
      ...                    has_chief=True).to_dict()
      {'chief': ['a:1'], 'worker': ['b:1', 'c:1']}
    """
    shape = _check_shape(num_workers, num_ps, has_chief, has_evaluator)
    tasks = _task_slots(*shape)
    if isinstance(hosts, str) or not isinstance(hosts, Sequence):
        raise TypeError(
            f"hosts must be a sequence of 'host:port' str; received "
            f"hosts={hosts!r} of type {type(hosts).__name__}."
        )
    if len(hosts) != len(tasks):
        raise errors.LauncherError(
            f"hosts lists {len(hosts)} address(es) but the job has "
            f"{len(tasks)} task(s) ({', '.join(t.name for t in tasks)}); "
            "expected one host:port per task, in the order chief, workers, "
            "ps, evaluator. Add or remove hosts, or change the task counts."
        )
    seen: dict[tuple[str, int], int] = {}
    for index, text in enumerate(hosts):
        try:
            address = spec.Address.parse(text)
        except errors.ClusterConfigError as e:
            raise errors.LauncherError(
                f"hosts[{index}]={text!r} (for task {tasks[index].name}) is "
                f"not a valid host:port: {e}"
            ) from e
        key = (address.host.lower(), address.port)
        if key in seen:
            raise errors.LauncherError(
                f"hosts[{index}]={text!r} repeats hosts[{seen[key]}]; "
                "expected a distinct host:port per task. Give each task its "
                "own host or port."
            )
        seen[key] = index
    return _cluster_from_addresses(tasks, [str(h) for h in hosts])


def tfjob_manifest(
    command: Sequence[str],
    *,
    num_workers: int,
    num_ps: int = 0,
    has_chief: bool = False,
    has_evaluator: bool = False,
    name: str = DEFAULT_TFJOB_NAME,
    image: str = DEFAULT_TFJOB_IMAGE,
    restarts: int | None = None,
    timeout_s: float | None = None,
) -> str:
    """Returns a Kubeflow `TFJob` (kubeflow.org/v1) YAML manifest for a job.

    Each replica type (Chief, Worker, PS, Evaluator) runs `command` in a
    container named `tensorflow` with `restartPolicy: OnFailure`; the
    Kubeflow training operator writes every pod's TF_CONFIG. `restarts`
    becomes `runPolicy.backoffLimit` and `timeout_s`
    `runPolicy.activeDeadlineSeconds` (rounded up).

    Args:
      command: The program and its arguments, non-empty.
      num_workers: Worker replicas, >= 1.
      num_ps: PS replicas, >= 0.
      has_chief: Whether to add a Chief replica.
      has_evaluator: Whether to add an Evaluator replica.
      name: The TFJob's name: lower-case letters, digits and '-', starting
        with a letter, at most 63 characters.
      image: Container image holding TensorFlow, tfdist and the script.
      restarts: Retries of the job after a failure, or `None` for the
        operator's default.
      timeout_s: Deadline for the whole job in seconds, or `None`.

    Returns:
      YAML text (its strings are JSON-quoted, which YAML reads as is).

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If `command` is empty, a count is out of range, or
        `name`/`image` is not usable in Kubernetes.

    Example:
      >>> text = tfjob_manifest(["python", "train.py"], num_workers=2)
      >>> "kind: TFJob" in text
      True
    """
    shape = _check_shape(num_workers, num_ps, has_chief, has_evaluator)
    argv = _check_command(command)
    if not isinstance(name, str) or not isinstance(image, str):
        raise TypeError(
            f"name and image must be str; received name={name!r}, "
            f"image={image!r}."
        )
    if len(name) > _K8S_NAME_MAX_CHARS or not _K8S_NAME.match(name):
        raise errors.LauncherError(
            f"name={name!r} is not a valid TFJob name; expected lower-case "
            "letters, digits and '-', starting with a letter and ending with "
            f"a letter or digit, at most {_K8S_NAME_MAX_CHARS} characters. "
            f"Pass a name such as {DEFAULT_TFJOB_NAME!r}."
        )
    if not image or any(c.isspace() for c in image):
        raise errors.LauncherError(
            f"image={image!r} is not a container image reference; expected "
            "e.g. 'registry.example.com/team/train:1.0'. Pass the image that "
            "holds TensorFlow, tfdist and your script."
        )
    if restarts is not None:
        restarts = validation.check_non_negative_int(
            "restarts", restarts, error=errors.LauncherError
        )
    if timeout_s is not None:
        timeout_s = validation.check_positive_number("timeout_s", timeout_s)
    counts = {"chief": int(shape[2]), "worker": shape[0], "ps": shape[1]}
    counts["evaluator"] = int(shape[3])
    quote = _yaml_string
    lines = [
        "# Generated by tfdist-launch. The Kubeflow training operator sets",
        "# TF_CONFIG in every replica.",
        "apiVersion: kubeflow.org/v1",
        "kind: TFJob",
        "metadata:",
        f"  name: {quote(name)}",
        "spec:",
    ]
    if restarts is not None or timeout_s is not None:
        lines.append("  runPolicy:")
        if restarts is not None:
            lines.append(f"    backoffLimit: {restarts}")
        if timeout_s is not None:
            lines.append(f"    activeDeadlineSeconds: {math.ceil(timeout_s)}")
    lines.append("  tfReplicaSpecs:")
    for task_type in spec.TASK_TYPES:
        if not counts[task_type]:
            continue
        lines += [
            f"    {_TFJOB_REPLICA_TYPES[task_type]}:",
            f"      replicas: {counts[task_type]}",
            "      restartPolicy: OnFailure",
            "      template:",
            "        spec:",
            "          containers:",
            "            - name: tensorflow",
            f"              image: {quote(image)}",
            "              command:",
        ]
        lines += [f"                - {quote(arg)}" for arg in argv]
    return "\n".join(lines) + "\n"


def _yaml_string(text: str) -> str:
    # JSON strings (ASCII, with JSON's escapes) are YAML double-quoted scalars.
    return json.dumps(text)


def _check_command(command: object) -> tuple[str, ...]:
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


# --------------------------------------------------------------------------
# Supervision.


class _Output:
    """Where task output goes: one lock for both streams, whole lines only.

    A sink that fails (closed, broken pipe) is dropped and output for it is
    discarded, so that pumps keep draining the tasks' pipes and no task
    blocks on a full pipe.
    """

    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        self._sinks: dict[str, TextIO | None] = {
            "stdout": stdout,
            "stderr": stderr,
        }
        self._lock = threading.Lock()

    def write_line(self, stream: str, text: str) -> None:
        with self._lock:
            sink = self._sinks[stream]
            if sink is None:
                return
            try:
                sink.write(text + "\n")
                sink.flush()
            except (OSError, ValueError):
                self._sinks[stream] = None


class _Task:
    """One running task: its process, output pumps and exit waiter."""

    def __init__(
        self,
        index: int,
        task: spec.TaskSpec,
        process: subprocess.Popen[bytes],
        output: _Output,
        events: queue.SimpleQueue[tuple[str, int, int]],
    ) -> None:
        self.index = index
        self.task = task
        self.process = process
        self.exit_code: int | None = None
        self.was_stopped = False
        self.was_killed = False
        prefix = f"[{task.name}] "
        self.pumps = [
            _start_daemon(
                f"tfdist-{task.name}-{stream}",
                _pump,
                pipe,
                prefix,
                stream,
                output,
            )
            for stream, pipe in (
                ("stdout", process.stdout),
                ("stderr", process.stderr),
            )
        ]
        self.waiter = _start_daemon(
            f"tfdist-{task.name}-wait", _wait_for_exit, index, process, events
        )

    @property
    def is_running(self) -> bool:
        return self.exit_code is None

    def signal_group(self, signal_number: int) -> bool:
        """Signals the task's process group; returns whether it was alive."""
        if self.exit_code is not None or self.process.returncode is not None:
            return False
        try:
            # start_new_session=True made the task the leader of its group.
            os.killpg(self.process.pid, signal_number)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def result(self) -> TaskResult:
        assert self.exit_code is not None  # Only built after reaping.
        return TaskResult(
            self.task,
            self.exit_code,
            was_stopped=self.was_stopped,
            was_killed=self.was_killed,
        )


def _start_daemon(
    name: str, target: Callable[..., None], *args: object
) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    thread.start()
    return thread


def _pump(
    pipe: IO[bytes] | None, prefix: str, stream: str, output: _Output
) -> None:
    """Copies `pipe` line by line to `output`, prefixed, until EOF."""
    if pipe is None:
        return
    with pipe:
        for line in iter(pipe.readline, b""):
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            output.write_line(stream, prefix + text)


def _wait_for_exit(
    index: int,
    process: subprocess.Popen[bytes],
    events: queue.SimpleQueue[tuple[str, int, int]],
) -> None:
    events.put(("exit", index, process.wait()))


class LocalJob:
    """Runs every task of a cluster as a local process and supervises them.

    Each task runs `command` (or `command(task)`) in its own process group,
    with stdin from /dev/null and the environment `env` plus `TF_CONFIG`
    (nothing else is added). Its output lines go to `stdout`/`stderr`
    prefixed with `[<task>] `. Python tasks buffer output when it is a pipe:
    run them with `python -u` (or set PYTHONUNBUFFERED in `env`) to see lines
    as they are written.

    The job succeeds when every chief/worker task (every task, if there are
    none) has exited 0; ps and evaluator tasks still running then are
    stopped. See the module docstring for the state machine.

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
      stdout: Where task stdout lines go; `None` means `sys.stdout` at the
        time `run` starts.
      stderr: Where task stderr lines go; `None` means `sys.stderr`.

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If `command` is empty.
      ConfigError: If `grace_period_s` is not a positive number.

    Example:
      >>> job = LocalJob(make_local_cluster(2), ["python", "-u", "train.py"],
      ...                env=dict(os.environ))
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
                _check_command(command(config.task))
                for config in self._configs
                if config.task is not None
            )
        else:
            argv = _check_command(command)
            self._commands = tuple(argv for _ in self._configs)
        self._env = dict(env)
        self._grace_period_s = validation.check_positive_number(
            "grace_period_s", grace_period_s
        )
        self._stdout = stdout
        self._stderr = stderr
        self._events: queue.SimpleQueue[tuple[str, int, int]] = (
            queue.SimpleQueue()
        )
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

    def run(self, timeout_s: float | None = None) -> JobResult:
        """Starts every task and blocks until the job ends.

        Args:
          timeout_s: Limit on the whole job in seconds, or `None` for none.

        Returns:
          The outcome and every task's exit code. On return, every task
          process has exited and been reaped, and its output is written.

        Raises:
          RuntimeError: If the job has already run.
          ConfigError: If `timeout_s` is not a positive number.
          LauncherError: If a task cannot be started (such as a command not
            found); the tasks already started are killed first.
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
        output = _Output(
            self._stdout if self._stdout is not None else sys.stdout,
            self._stderr if self._stderr is not None else sys.stderr,
        )
        started_s = time.monotonic()
        deadline_s = None if timeout_s is None else started_s + timeout_s
        tasks: list[_Task] = []
        try:
            for index, config in enumerate(self._configs):
                tasks.append(self._start(index, config, output))
            outcome, failed, signal_number = self._supervise(tasks, deadline_s)
            if outcome is not JobOutcome.SUCCEEDED or any(
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
        return JobResult(
            outcome=outcome,
            tasks=tuple(t.result() for t in tasks),
            failed_task=failed,
            signal_number=signal_number,
            timeout_s=timeout_s,
            elapsed_s=time.monotonic() - started_s,
        )

    def _start(
        self, index: int, config: spec.ClusterConfig, output: _Output
    ) -> _Task:
        assert config.task is not None
        env = dict(self._env)
        env[tf_config.TF_CONFIG_ENV_VAR] = config.to_json()
        command = self._commands[index]
        try:
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Own process group; see signal_group.
            )
        except OSError as e:
            raise errors.LauncherError(
                f"cannot start task {config.task.name}: command[0]="
                f"{command[0]!r} failed with {e.strerror or e}; expected an "
                "executable on PATH or a path to one. Check the command."
            ) from e
        return _Task(index, config.task, process, output, self._events)

    def _supervise(
        self, tasks: list[_Task], deadline_s: float | None
    ) -> tuple[JobOutcome, spec.TaskSpec | None, int | None]:
        primary = [t for t in tasks if t.task.task_type in _PRIMARY_TASK_TYPES]
        primary = primary or tasks
        while True:
            wait_s = _MAX_WAIT_SLICE_S
            if deadline_s is not None:
                wait_s = min(wait_s, deadline_s - time.monotonic())
                if wait_s <= 0:
                    return JobOutcome.TIMED_OUT, None, None
            try:
                kind, index, value = self._events.get(timeout=wait_s)
            except queue.Empty:
                continue
            if kind == "stop":
                return JobOutcome.INTERRUPTED, None, value
            task = tasks[index]
            task.exit_code = value
            if value != 0:
                return JobOutcome.FAILED, task.task, None
            if all(not t.is_running for t in primary):
                return JobOutcome.SUCCEEDED, None, None

    def _stop(self, tasks: list[_Task], signal_number: int) -> None:
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


def _kill_and_reap(tasks: Sequence[_Task]) -> None:
    """SIGKILLs what still runs, reaps every task, drains its output."""
    for task in tasks:
        if task.is_running:
            task.signal_group(signal.SIGKILL)
    for task in tasks:
        # The waiter thread reaps; Popen.wait is safe to call alongside it.
        task.exit_code = task.process.wait()
        task.waiter.join()
    # A pump still open after its task exited is held by a process the task
    # left behind in its group: kill the group, then drain what is left.
    drain_deadline_s = time.monotonic() + _DRAIN_TIMEOUT_S
    for task in tasks:
        for pump in task.pumps:
            pump.join(max(0.0, drain_deadline_s - time.monotonic()))
        if any(pump.is_alive() for pump in task.pumps):
            try:
                os.killpg(task.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for pump in task.pumps:
                pump.join(_DRAIN_TIMEOUT_S)


# --------------------------------------------------------------------------
# The whole job, as the command line runs it.


class _SignalForwarder:
    """Forwards SIGINT/SIGTERM to the current job while installed."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.job: LocalJob | None = None
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
    *,
    num_workers: int,
    num_ps: int = 0,
    has_chief: bool = False,
    has_evaluator: bool = False,
    env: Mapping[str, str],
    restarts: int = 0,
    timeout_s: float | None = None,
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
    forward_signals: bool = False,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> JobResult:
    """Runs a job on a fresh local cluster, restarting it after failures.

    Each attempt gets a new `make_local_cluster` (fresh ports, so a task
    that lingers or a port in TIME_WAIT cannot break the next attempt; a
    script must not depend on its port across restarts). Only a `FAILED`
    attempt is restarted; a timeout or a stop request ends the job. The
    launcher's own messages go to `stderr` prefixed `tfdist-launch: `,
    including `restart i/K` before each restart.

    Args:
      command: The program and arguments every task runs.
      num_workers: Worker tasks, >= 1.
      num_ps: Parameter-server tasks, >= 0.
      has_chief: Whether to add a `chief` task.
      has_evaluator: Whether to add an `evaluator` task.
      env: The tasks' environment, without TF_CONFIG.
      restarts: How many times to relaunch the whole job after a failure.
      timeout_s: Limit on all attempts together, or `None`.
      grace_period_s: Seconds a stopped task has to exit before SIGKILL.
      forward_signals: Whether to forward SIGINT/SIGTERM received by this
        process to the tasks (main thread only; handlers are restored on
        return).
      stdout: Where task stdout goes; `None` means `sys.stdout`.
      stderr: Where task stderr and launcher messages go; `None` means
        `sys.stderr`.

    Returns:
      The result of the last attempt; `timeout_s` in it is the whole job's.

    Raises:
      TypeError: If an argument has the wrong type.
      LauncherError: If a count or `restarts` is out of range, the command
        is empty, or a task cannot be started.
      ConfigError: If `timeout_s` or `grace_period_s` is not positive.

    Example:
      >>> result = run_local_job(["python", "-u", "train.py"], num_workers=2,
      ...                        env=dict(os.environ), restarts=1)
      >>> result.exit_status
      0
    """
    _check_shape(num_workers, num_ps, has_chief, has_evaluator)
    argv = _check_command(command)
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

    deadline_s = None if timeout_s is None else time.monotonic() + timeout_s
    forwarder = _SignalForwarder()
    with contextlib.ExitStack() as stack:
        if forward_signals:
            stack.enter_context(forwarder)
        attempt = 0
        while True:
            cluster = make_local_cluster(
                num_workers,
                num_ps=num_ps,
                has_chief=has_chief,
                has_evaluator=has_evaluator,
            )
            job = LocalJob(
                cluster,
                argv,
                env=env,
                grace_period_s=grace_period_s,
                stdout=stdout,
                stderr=stderr,
            )
            forwarder.job = job
            if forwarder.signal_number is not None:
                job.request_stop(forwarder.signal_number)
            log(
                f"starting {cluster.num_tasks} task(s): "
                + ", ".join(
                    f"{t.name}={cluster.address(t)}" for t in cluster.tasks()
                )
            )
            remaining_s = None
            if deadline_s is not None:
                remaining_s = max(deadline_s - time.monotonic(), 1e-3)
            result = job.run(timeout_s=remaining_s)
            if result.outcome is JobOutcome.TIMED_OUT:
                result = dataclasses.replace(result, timeout_s=timeout_s)
            forwarder.job = None
            if (
                result.outcome is not JobOutcome.FAILED
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
