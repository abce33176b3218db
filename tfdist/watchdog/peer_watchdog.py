"""The watchdog thread: lost peers and overdue collectives end in tfdist errors.

`PeerWatchdog` runs in a daemon thread of every task, started with the
strategy. Every `interval_s` it

1. publishes how many collectives this task has started (a key per task in
   TF's coordination service), so that a task whose collective is overdue
   can name the peers that have not reached it;
2. checks the `CollectiveClock`: a collective whose input has been ready
   for `timeout_s` with no collective finishing meanwhile is overdue: every
   collective of this process is aborted with `CollectiveTimeoutError`
   naming the peers behind (a peer that is alive but stuck: it answers
   probes, so it is not "lost");
3. probes every peer's collective service: a peer that stops answering
   (and did not finish cleanly) is lost: every collective of this process
   is aborted and the waiting `model.fit` raises `WorkerUnavailableError`
   naming it.

Timelines: a killed peer is reported within `interval_s` + `attempts` x
`probe_timeout_s` (a few seconds; the coordination service's own heartbeat
timeout is longer, so tfdist, not TF, reports it); a stuck peer between
`timeout_s` and `timeout_s` + 2 x (`interval_s` + one probe round) after
its peers entered the collective it does not join.

Clean finish: at normal interpreter exit each task records
`tfdist/finished/<task>` in the coordination service and stops its
watchdog before TF's shutdown barrier, so peers that finish first are not
reported as lost.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist._internal import coordination
from tfdist._internal import cross_device
from tfdist._internal import tf_errors
from tfdist.cluster import ClusterConfig
from tfdist.cluster import spec as spec_lib
from tfdist.watchdog import clock as clock_lib
from tfdist.watchdog import startup

__all__ = ["DEFAULT_TIMEOUT_S", "PeerWatchdog"]

#: Default bound on one cross-task collective, in seconds (every strategy's `timeout_s`).
DEFAULT_TIMEOUT_S = 300.0

_FINISHED_KEY = "tfdist/finished/{task}"
_PROGRESS_KEY = "tfdist/progress/{task}"


class PeerWatchdog:
    """Probes peer tasks; on a loss or an overdue collective, aborts with a tfdist error.

    Contract: build it right after the TF strategy (before any value is
    reduced or variable created) and `start` it once. It stops by itself
    after reporting, when `stop` is called, or at normal interpreter exit;
    it never blocks the process from exiting (daemon thread).

    Args:
      config: The validated cluster with this process's task.
      timeout_s: Bound on one collective; detection of a killed peer is
        kept well inside it.
      peer_jobs: Jobs whose tasks are this task's peers.
      collective_ops: TF `CollectiveAllReduce`s whose collectives to bound
        (their launchers are wrapped here); empty: probe peers only.
      extended: A MultiWorkerMirroredStrategy's `extended`, whose initial
        variable broadcasts to bound too; None: none.
      bound_eager_calls: Whether `run_bounded` will be used (it needs the
        collective clock).
      on_abort: Called (on the watchdog's thread) with the tfdist error of
        a verdict, when TF's collectives are aborted: transports of the
        caller's own (`collectives.host_memory`) end their waits with it.
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        timeout_s: float,
        peer_jobs: Sequence[str] = ("chief", "worker"),
        collective_ops: Sequence[Any] = (),
        extended: Any = None,
        bound_eager_calls: bool = False,
        on_abort: Sequence[Callable[[errors.CollectiveError], None]] = (),
    ) -> None:
        assert config.task is not None and config.cluster is not None
        self._task = config.task
        self._peers: Sequence[spec_lib.TaskSpec] = [
            t
            for t in config.cluster.tasks()
            if t.task_type in peer_jobs and t != config.task
        ]
        self.interval_s = min(1.0, timeout_s / 8)
        self.probe_timeout_s = min(2.0, timeout_s / 8)
        self.attempts = 2
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="tfdist-peer-watchdog", daemon=True
        )
        self._timeout_s = timeout_s
        self._on_abort = list(on_abort)
        self._clock: clock_lib.CollectiveClock | None = None
        if collective_ops or extended is not None or bound_eager_calls:
            clock = clock_lib.CollectiveClock(f"{startup.device_name(config.task)}/device:CPU:0")
            cross_device.watch_collectives(
                collective_ops, clock.before, clock.after, self._eager_error
            )
            if extended is not None:
                cross_device.watch_initial_value_broadcasts(
                    extended, lambda fn: self._run_eager(clock, fn)
                )
            self._clock = clock
        # (finished count, when first seen with a collective in flight).
        self._waiting: tuple[int, float] | None = None
        self._published: int | None = None
        self._remove_hook: Callable[[], None] | None = None
        self.lost: str | None = None
        self._lost_message = ""
        self._verdict = threading.Event()
        self.overdue = False

    def start(self) -> None:
        """Starts probing; registers the clean-finish hook (see module)."""
        clock = self._clock

        def resync(error: BaseException) -> None:
            del error  # Any failed call may have left collectives unfinished.
            if clock is not None:
                clock.resync()

        self._remove_hook = tf_errors.install_function_error_hook(resync, self._classify)
        atexit.register(self._finish_cleanly)
        self._thread.start()

    def stop(self) -> None:
        """Stops probing (no report after this returns); removes its hook on TF's function errors.

        Idempotent. The strategy that started it calls it when it is
        garbage-collected, so TF's error class is as it was once no
        multi-worker strategy is left.
        """
        self._stop.set()
        if self._remove_hook is not None:
            self._remove_hook()
            self._remove_hook = None
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + self.probe_timeout_s * 2)

    def run_bounded(self, call: Callable[[], Any]) -> Any:
        """Runs a blocking eager `call` as one collective in flight, bounded by `timeout_s`.

        For work whose cross-task collectives TF runs where tfdist cannot
        wrap them one by one: a step of TF's DTensor on a multi-client mesh,
        waited for. `call` must block until its collectives have finished
        (or raise). Its TF errors caused by a lost peer or an overdue wait
        are raised as tfdist's classes; others as they are. Needs
        `bound_eager_calls=True` at construction.
        """
        assert self._clock is not None, "built without bound_eager_calls"
        return self._run_eager(self._clock, call)

    def _eager_error(self, error: tf.errors.OpError) -> BaseException:
        if self._clock is not None:
            self._clock.resync()
        return tf_errors.as_tfdist_error(error, self._classify)

    def _run_eager(self, clock: clock_lib.CollectiveClock, call: Callable[[], Any]) -> Any:
        try:
            return clock.watch_eager(call)
        except tf.errors.OpError as e:
            converted = tf_errors.as_tfdist_error(e, self._classify)
            if converted is e:
                raise
            raise converted from e

    def _classify(self, error: tf.errors.OpError) -> str | None:
        """A marked message for a collective that TF failed before tfdist aborted it.

        A killed peer often surfaces first as TF's own UNAVAILABLE error
        (its connection closed). Waits for this watchdog's verdict on the
        peers, at most one detection time; None if no peer is lost.
        """
        if not isinstance(error, tf.errors.UnavailableError):
            return None
        if not self._verdict.is_set():
            if not self._thread.is_alive():
                return None  # Stopped: no verdict will come.
            self._verdict.wait(
                self.interval_s
                + self.attempts * (self.probe_timeout_s + self.interval_s)
            )
        if self.lost is None:
            return None
        return tf_errors.abort_message(
            errors.WorkerUnavailableError, self.lost, self._lost_message
        )

    def _finish_cleanly(self) -> None:
        self.stop()
        if self.lost is not None or self.overdue or getattr(sys, "last_value", None) is not None:
            return
        try:
            coordination.set_key(_FINISHED_KEY.format(task=self._task.name), "1")
        except tf.errors.OpError:
            pass  # The service leader is gone; nothing to tell.

    def _peer_finished(self, peer: spec_lib.TaskSpec) -> bool:
        key = _FINISHED_KEY.format(task=peer.name)
        return coordination.get_key(key, timeout_s=0.2) is not None

    def _probe(self, peer: spec_lib.TaskSpec) -> Exception | None:
        last: Exception | None = None
        for _ in range(self.attempts):
            try:
                coordination.check_peer_health(
                    startup.device_name(peer), int(self.probe_timeout_s * 1000)
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
            self._publish_progress()
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

    def _publish_progress(self) -> None:
        if self._clock is None:
            return
        started, _ = self._clock.counts()
        if started == self._published:
            return
        key = _PROGRESS_KEY.format(task=self._task.name)
        try:
            coordination.delete_key(key)
            coordination.set_key(key, str(started))
            self._published = started
        except tf.errors.OpError:
            pass  # The leader is gone: probes will say so.

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
        self._lost_message = message
        self._verdict.set()
        coordination.abort_collectives(
            tf_errors.abort_message(errors.WorkerUnavailableError, peer.name, message),
            tf.errors.UNAVAILABLE,
        )
        self._abort_own(errors.WorkerUnavailableError(message, task=peer.name))

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

    def _peers_behind(self, peers: Sequence[spec_lib.TaskSpec]) -> list[str]:
        """Peers that have started fewer collectives than this task has."""
        assert self._clock is not None
        started, _ = self._clock.counts()
        behind = []
        for peer in peers:
            value = coordination.get_key(
                _PROGRESS_KEY.format(task=peer.name), timeout_s=self.probe_timeout_s
            )
            count = int(value) if value is not None else 0
            if count < started:
                behind.append(f"{peer.name} (at collective {count}, this task at {started})")
        return behind

    def _report_overdue(self, peers: Sequence[spec_lib.TaskSpec]) -> None:
        self.overdue = True
        self._verdict.set()
        behind = self._peers_behind(peers)
        if behind:
            who = (
                f"{', '.join(behind)} did not arrive at it: alive (it answers "
                "health probes) but not taking part, e.g. stuck before this "
                "collective, far slower, or running other collectives (another "
                "model, batch size or number of steps)"
            )
        else:
            who = (
                f"its peers ({', '.join(p.name for p in peers)}) still answer "
                "health probes and have reached it: one of them is stuck inside "
                "it"
            )
        message = (
            f"a cross-task collective of task {self._task.name} waited more "
            f"than timeout_s={self._timeout_s:g} s; {who}. All collectives of "
            "this process are aborted. Check the peers' logs; raise timeout_s "
            "if one step can legitimately take longer."
        )
        logging.error("tfdist: CollectiveTimeoutError: %s", message)
        first_behind = behind[0].split(" ")[0] if behind else None
        coordination.abort_collectives(
            tf_errors.abort_message(errors.CollectiveTimeoutError, first_behind, message),
            tf.errors.DEADLINE_EXCEEDED,
        )
        self._abort_own(errors.CollectiveTimeoutError(message, task=first_behind))

    def _abort_own(self, error: errors.CollectiveError) -> None:
        for abort in self._on_abort:
            abort(error)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
