"""Bounded waits for a multi-worker job: lost peers become tfdist errors.

TF's MultiWorkerMirroredStrategy leaves three waits unbounded or unnamed
(`shared/notes/tf-extension-points.md`, addendum): start-up waits forever
for a worker that never starts; a killed peer surfaces, if at all, as a TF
`UnavailableError` from deep inside `fit`; and a process can hang at exit
in the coordination service's shutdown barrier. tfdist bounds them:

1. Before the strategy starts, `configure_coordination` sets the
   coordination service's register, heartbeat and shutdown-barrier
   timeouts from `timeout_s` (TF's own call would set none).
   `check_own_port` refuses a second process with this task's address.
   `unreachable_peers` names the tasks that do not accept connections when
   start-up fails.
2. `PeerWatchdog`, a daemon thread started with the strategy, probes every
   peer's collective service each `interval_s`. A peer that stops answering
   (and did not finish cleanly) is declared lost: the watchdog aborts every
   collective of this process (pending and later ones fail at once), so the
   `model.fit` waiting on one raises `WorkerUnavailableError` naming the
   peer. TF raises that error from C++, so tfdist has TF build it: from
   then on TF's UNAVAILABLE errors in this process are a tfdist subclass
   of both `tfdist.errors.WorkerUnavailableError` and
   `tf.errors.UnavailableError` (`tf_private.raise_errors_as`).

   Timeline for a killed peer: within `interval_s` + `probe_timeout_s` x
   `attempts` (a few seconds by default, bounded by `timeout_s`) the
   survivor raises; the coordination service's own heartbeat timeout is
   set longer, so tfdist, not TF, reports the loss.

3. `CollectiveClock` counts this process's cross-worker collectives as
   they start and finish (two host counters bracketing every collective
   of training; `tf_private.watch_collectives`), and the same watchdog
   thread checks them: a collective whose input has been ready for
   `timeout_s` with no collective finishing meanwhile is overdue, and
   every collective of this process is aborted with
   `CollectiveTimeoutError` (a subclass of both it and
   `tf.errors.DeadlineExceededError`). That is how a peer that is alive
   but stuck (it answers probes, so it is not "lost") ends the job.

   Why not TF's per-collective `timeout`: for each collective op with a
   timeout, TF 2.21 starts two threads that sleep for the whole timeout,
   measured at +2 threads per collective per process. A Keras step runs
   4-5 collectives, so at 50 steps/s and timeout_s=300 a worker would hold
   120,000-150,000 sleeping threads, past Linux's default `vm.max_map_count`
   (65,530 mappings; each thread stack takes two) and `kernel.pid_max`
   (32,768 on many machines): the process would die within minutes. The
   counters cost two scalar increments per collective.

Timeline for a stuck peer: its peers raise `CollectiveTimeoutError`
between `timeout_s` and `timeout_s` + 2 x (`interval_s` + one probe round)
after entering the collective it does not join.

Clean finish: at normal interpreter exit each task records
`tfdist/finished/<task>` in the coordination service and stops its
watchdog before TF's shutdown barrier, so peers that finish first are not
reported as lost.
"""

from __future__ import annotations

import atexit
import errno
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist._internal import tf_private
from tfdist.cluster import ClusterConfig
from tfdist.cluster import spec as spec_lib

__all__ = [
    "CollectiveClock",
    "PeerWatchdog",
    "check_own_port",
    "configure_coordination",
    "unreachable_peers",
]

_FINISHED_KEY = "tfdist/finished/{task}"
#: Seconds a TCP connect to a peer may take in `unreachable_peers`.
_CONNECT_TIMEOUT_S = 2.0


def _device_name(task: spec_lib.TaskSpec) -> str:
    return f"/job:{task.task_type}/replica:0/task:{task.task_id}"


def _training_tasks(config: ClusterConfig) -> list[spec_lib.TaskSpec]:
    assert config.cluster is not None
    return [t for t in config.cluster.tasks() if t.task_type in ("chief", "worker")]


def configure_coordination(config: ClusterConfig, timeout_s: float) -> None:
    """Configures TF's coordination service with bounds from `timeout_s`.

    Must run before TF's MultiWorkerMirroredStrategy is built (which then
    keeps this configuration). Registration and the shutdown barrier wait
    at most `timeout_s`; a silent peer is declared dead by TF after
    `2 * timeout_s` (tfdist's watchdog reports it sooner).
    """
    assert config.cluster is not None
    jobs = [
        (job, len(config.cluster.addresses(job)))
        for job in ("chief", "worker")
        if config.cluster.addresses(job)
    ]
    leader = "chief" if config.cluster.addresses("chief") else "worker"
    millis = int(timeout_s * 1000)
    tf_private.configure_coordination_service(
        jobs,
        f"/job:{leader}/replica:0/task:0",
        register_timeout_ms=millis,
        heartbeat_timeout_ms=2 * millis,
        shutdown_barrier_timeout_ms=millis,
    )


def check_own_port(config: ClusterConfig) -> None:
    """Raises ClusterConfigError if this task's port is already taken.

    Two processes started with the same task index (or a stale process
    still holding the port) would otherwise fail inside TF's gRPC server
    start or wait for each other. Hosts that are not an address of this
    machine are not checked.
    """
    if config.cluster is None or config.task is None:
        return
    address = spec_lib.Address.parse(config.cluster.address(config.task))
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address.host, address.port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return  # Not a local address, or no permission: TF decides.
            raise errors.ClusterConfigError(
                f"task {config.task.name}'s address {address} is already in "
                "use: another process was started with the same task index, "
                "or a previous run still holds the port. Give every process "
                "its own task.index in TF_CONFIG (tfdist-launch does), or stop "
                "the old process.",
                field="task.index",
            ) from e


def unreachable_peers(config: ClusterConfig) -> list[str]:
    """Names of the other chief/worker tasks that refuse TCP connections."""
    assert config.cluster is not None
    names = []
    for task in _training_tasks(config):
        if task == config.task:
            continue
        address = spec_lib.Address.parse(config.cluster.address(task))
        try:
            with socket.create_connection(
                (address.host, address.port), timeout=_CONNECT_TIMEOUT_S
            ):
                pass
        except OSError:
            names.append(f"{task.name} ({address})")
    return names


class CollectiveClock:
    """Counts the cross-worker collectives this process started and finished.

    Contract: built eagerly, inside a strategy scope or not (the counters
    bypass variable creators); `before` and `after` are called by
    the launcher wrappers (`tf_private.watch_collectives`) when collectives
    are created, in a `tf.function` or eagerly; `counts` may be called from
    any thread at any time.

    A call that fails can leave collectives counted as started that will
    never finish; `resync` (called by the watchdog after any failed
    `tf.function` call or eager collective, when none of them can still be
    running) forgets them.

    Args:
      device: Where the two int64 counters live (this task's CPU).
    """

    def __init__(self, device: str) -> None:
        with tf.init_scope(), tf.device(device):
            self._started = tf_private.make_local_counter("tfdist_collectives_started")
            self._finished = tf_private.make_local_counter("tfdist_collectives_finished")

    def before(self, tensor: tf.Tensor) -> tf.Tensor:
        """`tensor`, passed on once computed and counted as started.

        The count goes up only after `tensor` exists (so the compute that
        produces a collective's input is not counted as waiting) and before
        the collective can read it.
        """
        with tf.control_dependencies([tensor]):
            started = self._started.assign_add(1)
        with tf.control_dependencies([started]):
            return tf.identity(tensor)

    def after(self, tensor: tf.Tensor) -> tf.Tensor:
        """`tensor`; the finished count goes up once it is computed."""
        with tf.control_dependencies([tensor]):
            self._finished.assign_add(1)
        return tensor

    def counts(self) -> tuple[int, int]:
        """(started, finished) so far; started > finished: one in flight."""
        return int(self._started.numpy()), int(self._finished.numpy())

    def resync(self) -> None:
        """Counts every started collective as finished (see class docstring)."""
        self._finished.assign(self._started.read_value())


class PeerWatchdog:
    """Probes peer tasks; on a loss, aborts collectives with a tfdist error.

    Contract: `start` once, after the strategy is built (probing needs the
    collective runtime). The watchdog stops by itself after reporting a
    loss or an overdue collective, when `stop` is called, or at normal
    interpreter exit; it never blocks the process from exiting (daemon
    thread).

    Args:
      config: The validated cluster with this process's task.
      timeout_s: The strategy's bound on one collective; detection of a
        killed peer is kept well inside it.
      collective_ops: TF `CollectiveAllReduce`s whose collectives to bound
        by `timeout_s` (a `CollectiveClock` is wrapped around their
        launchers here, before any value is reduced); empty: probe peers
        only.
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        timeout_s: float,
        collective_ops: Sequence[Any] = (),
    ) -> None:
        assert config.task is not None
        self._task = config.task
        self._peers: Sequence[spec_lib.TaskSpec] = [
            t for t in _training_tasks(config) if t != config.task
        ]
        self.interval_s = min(1.0, timeout_s / 8)
        self.probe_timeout_s = min(2.0, timeout_s / 8)
        self.attempts = 2
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="tfdist-peer-watchdog", daemon=True
        )
        self._timeout_s = timeout_s
        self._clock: CollectiveClock | None = None
        if collective_ops:
            clock = CollectiveClock(f"{_device_name(config.task)}/device:CPU:0")
            tf_private.watch_collectives(
                collective_ops, clock.before, clock.after, clock.resync
            )
            self._clock = clock
        # (finished count, when first seen with a collective in flight).
        self._waiting: tuple[int, float] | None = None
        self.lost: str | None = None
        self.overdue = False

    def start(self) -> None:
        """Starts probing; registers the clean-finish hook (see module)."""
        tf_private.install_error_class_hook()
        if self._clock is not None:
            tf_private.on_function_error(self._clock.resync)
        atexit.register(self._finish_cleanly)
        self._thread.start()

    def stop(self) -> None:
        """Stops probing (no report after this returns)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + self.probe_timeout_s * 2)

    def _finish_cleanly(self) -> None:
        self.stop()
        if self.lost is not None or self.overdue or getattr(sys, "last_value", None) is not None:
            return
        try:
            tf_private.set_cluster_key(_FINISHED_KEY.format(task=self._task.name), "1")
        except tf.errors.OpError:
            pass  # The service leader is gone; nothing to tell.

    def _peer_finished(self, peer: spec_lib.TaskSpec) -> bool:
        key = _FINISHED_KEY.format(task=peer.name)
        return tf_private.get_cluster_key(key, timeout_ms=200) is not None

    def _probe(self, peer: spec_lib.TaskSpec) -> Exception | None:
        last: Exception | None = None
        for _ in range(self.attempts):
            try:
                tf_private.check_peer_health(
                    _device_name(peer), int(self.probe_timeout_s * 1000)
                )
                return None
            except tf.errors.OpError as e:
                last = e
                if self._stop.wait(self.interval_s / 2):
                    return None
        return last

    def _run(self) -> None:
        peers = list(self._peers)
        while peers and not self._stop.wait(self.interval_s):
            if self._collective_overdue():
                self._report_overdue(peers)
                return
            for peer in list(peers):
                failure = self._probe(peer)
                if failure is None or self._stop.is_set():
                    continue
                if self._peer_finished(peer):
                    peers.remove(peer)
                    continue
                self._report(peer, failure)
                return

    def _report(self, peer: spec_lib.TaskSpec, cause: Exception) -> None:
        self.lost = peer.name
        message = (
            f"task {peer.name} is lost: it stopped answering this task "
            f"({self._task.name}) in {self.attempts} health probes "
            f"({type(cause).__name__}: {_first_line(cause)}). "
            "All collectives of this process are aborted. Check that task's "
            "log for why it exited; restart the job (tfdist-launch "
            "--restarts N with keras.callbacks.BackupAndRestore resumes it)."
        )
        logging.error("tfdist: WorkerUnavailableError: %s", message)
        tf_private.raise_errors_as(
            tf.errors.UNAVAILABLE,
            _error_class(errors.WorkerUnavailableError, tf.errors.UnavailableError, peer.name),
        )
        tf_private.abort_collectives(f"tfdist.errors.WorkerUnavailableError: {message}")

    def _collective_overdue(self) -> bool:
        """Whether one collective has been in flight for over `timeout_s`."""
        if self._clock is None:
            return False
        started, finished = self._clock.counts()
        now = time.monotonic()
        if started <= finished:
            self._waiting = None
            return False
        if self._waiting is None or self._waiting[0] != finished:
            self._waiting = (finished, now)  # In flight since about now.
            return False
        return now - self._waiting[1] > self._timeout_s

    def _report_overdue(self, peers: Sequence[spec_lib.TaskSpec]) -> None:
        self.overdue = True
        message = (
            f"a cross-worker collective of task {self._task.name} waited more "
            f"than timeout_s={self._timeout_s:g} s while its peers "
            f"({', '.join(p.name for p in peers)}) still answer health probes: "
            "a peer is alive but not taking part (stuck, far slower than this "
            "task, or running different collectives: another model, batch "
            "size or number of steps). All collectives of this process are "
            "aborted. Check the peers' logs; raise timeout_s if one step can "
            "legitimately take longer."
        )
        logging.error("tfdist: CollectiveTimeoutError: %s", message)
        tf_private.raise_errors_as(
            tf.errors.DEADLINE_EXCEEDED,
            _error_class(errors.CollectiveTimeoutError, tf.errors.DeadlineExceededError, None),
        )
        tf_private.abort_collectives(
            f"tfdist.errors.CollectiveTimeoutError: {message}", tf.errors.DEADLINE_EXCEEDED
        )


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _error_class(
    tfdist_class: type[errors.CollectiveError],
    tf_class: type[tf.errors.OpError],
    task: str | None,
) -> type[tf.errors.OpError]:
    """TF's `tf_class` as a subclass of `tfdist_class` too, for `task`.

    TF constructs it (`node_def, op, message, ...`) for the aborted
    collective; `isinstance` holds for both classes, and `task` is set.
    """

    def __init__(self: Any, node_def: Any, op: Any, message: str, *args: Any) -> None:
        tf_class.__init__(self, node_def, op, message, *args)
        self.task = task

    return type(
        tfdist_class.__name__,
        (tfdist_class, tf_class),
        # A class attribute too: an instance re-classed by
        # tf_private.install_error_class_hook skips __init__.
        {"__init__": __init__, "__module__": errors.__name__, "task": task},
    )
