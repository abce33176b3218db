"""Schedules compiled steps on the workers, with every wait bounded.

`StepScheduler` wraps TF's `ClusterCoordinator` (whose queue hands each
scheduled function to the next free worker, and queues a function again
when its worker fails). tfdist schedules a small Python closure per step:
it records which worker runs the step and when it started, calls the
compiled step (on that worker: the coordinator runs it under the
worker's device scope), and marks the step done. The chief's waits then
never block inside TF without a bound:

    schedule(step):  while the window is full:
                         wait(oldest)
                     queue closure(step)
    window:          max_in_flight; with max_staleness=k and up to s steps
                     per function, at most floor(k / 2s) + 1 (see below)
    wait(step):      until step is done:
                         sleep on the step's event, at most poll_s
                         a scheduled function failed?  -> raise it (a lost
                             ps becomes WorkerUnavailableError naming it)
                         a ps refuses connections?     -> WorkerUnavailableError
                         a step has run > timeout_s?   -> CollectiveTimeoutError
                                                          naming its worker
                         no step ran for > timeout_s?  -> CollectiveTimeoutError
                                                          naming the lost workers
    wait_all():      wait(every step in flight)      # the epoch barrier

Bounded staleness (`max_staleness=k`): a function is scheduled only when
every function scheduled `w` or more before it has finished (the window
above, `w = staleness_window(k, s)`). A function then runs at the same
time as at most `2(w - 1)` others (the `w - 1` before it and the `w - 1`
after it), each of at most `s` steps, so at most `2(w - 1)s <= k` updates
land between a step's reads of the parameters and its own update (steps
inside one function run one after another). Instrumented:
`largest_staleness_seen` is, over all steps, the largest number of steps
of other functions that ran at the same time (a step starts on the chief
before its worker reads the parameters and ends after its updates are
applied, so this bounds the true staleness from above).

A worker that dies mid-step is TF's to handle: its step is queued again,
with the same arguments (the same batch), and runs on another worker;
`reruns` counts how often that happened. TF also re-queues a step that had
finished when its worker's failure surfaced (copying its outputs failed);
for a `step_ledger.Recorded` function the re-run first reads the ledger
and skips a step that had finished (`reruns_skipped`; its result is
None). Contract: the methods are called
from one thread (the one running Keras's loop); after any error raised
here, the strategy cannot schedule again (restart the job).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist._internal import ps_runtime
from tfdist.cluster import ClusterConfig
from tfdist.parameter_server import step_ledger
from tfdist.watchdog import startup

__all__ = ["Step", "StepScheduler", "lost_ps_error", "staleness_window"]

#: Longest single sleep of a wait, seconds (how late an error is noticed).
_POLL_S = 0.05
#: Seconds between two TCP probes of the ps tasks.
_PROBE_INTERVAL_S = 1.0
#: Consecutive refused probes after which a ps task is lost.
_PROBE_FAILURES = 2

_PS_TASK = re.compile(r"/job:ps/replica:\d+/task:(\d+)")


def staleness_window(max_staleness: int | None, steps_per_function: int, max_in_flight: int) -> int:
    """Functions in flight at most, so that no update is more than `max_staleness` steps stale.

    Args:
      max_staleness: k >= 0, or None (unbounded: `max_in_flight`).
      steps_per_function: The most steps one scheduled function runs (>= 1).
      max_in_flight: The window without a staleness bound (>= 1).
    """
    if max_staleness is None:
        return max_in_flight
    return max(1, min(max_in_flight, max_staleness // (2 * steps_per_function) + 1))


@dataclasses.dataclass(eq=False)
class Step:
    """One scheduled function: what the chief knows about it.

    Attributes:
      index: Order of scheduling, from 0.
      scheduled_s: `time.monotonic()` when it was queued.
      worker: Index of the worker running (or that ran) it, once started.
      started_s: When its current attempt started; None when not running.
      attempts: How many times a worker started it (> 1: re-run after a
        worker failure).
      done: Set when an attempt finished without error.
      num_steps: Steps (batches) the function runs, one after another.
      overlap_steps: Steps of other functions that ran while this one
        ran (an upper bound on its staleness).
      keep_outputs: Whether its outputs are copied to the chief (else they
        are dropped on the worker and its result is None).
    """

    index: int
    scheduled_s: float
    num_steps: int = 1
    keep_outputs: bool = True
    overlap_steps: int = 0
    remote: Any = None
    worker: int | None = None
    started_s: float | None = None
    attempts: int = 0
    done: threading.Event = dataclasses.field(default_factory=threading.Event)


class StepScheduler:
    """Runs compiled steps on the workers of a parameter-server cluster.

    Args:
      coordinator: TF's `ClusterCoordinator` of the strategy.
      config: The cluster (for naming and probing tasks).
      timeout_s: Bound on one step, and on a stretch with no step finishing.
      max_in_flight: Steps queued or running at most (back-pressure).
      max_staleness: The staleness bound k (steps), or None for none.
    """

    def __init__(
        self,
        coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
        config: ClusterConfig,
        *,
        timeout_s: float,
        max_in_flight: int,
        max_staleness: int | None = None,
    ) -> None:
        assert config.cluster is not None
        if max_in_flight >= step_ledger.SIZE:
            raise errors.ConfigError(
                f"{max_in_flight} steps in flight would reuse step-ledger slots "
                f"still in use (the ledger has {step_ledger.SIZE}); received "
                f"max_in_flight={max_in_flight}. Use fewer workers per chief, or "
                "raise step_ledger.SIZE."
            )
        self._coordinator = coordinator
        self._config = config
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self._max_staleness = max_staleness
        self.largest_staleness_seen = 0
        self._in_flight: collections.deque[Step] = collections.deque()
        self._finished: list[Step] = []
        self._count = 0
        self._lock = threading.Lock()
        self._running: set[Step] = set()
        self._last_progress_s = time.monotonic()
        self.reruns = 0
        self.reruns_skipped = 0
        self.completed = 0
        self.executions_by_worker: collections.Counter[int] = collections.Counter()
        self._lost: str | None = None
        self._lost_reason = ""
        self._probe_stop = threading.Event()
        self._probe = threading.Thread(
            target=self._probe_ps, name="tfdist-ps-probe", daemon=True
        )
        self._probe.start()

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def close(self) -> None:
        """Stops probing the ps tasks."""
        self._probe_stop.set()

    def schedule(
        self,
        function: Callable[..., Any],
        args: Sequence[Any],
        *,
        num_steps: int = 1,
        steps_per_function: int = 1,
        keep_outputs: bool = True,
    ) -> Step:
        """Queues `function(*args)` for the next free worker; returns its `Step`.

        `function` is a compiled step (a `ConcreteFunction`, traced on this
        thread) running `num_steps` steps; `steps_per_function` is the most
        any function of this loop runs (Keras's `steps_per_execution`).
        With `keep_outputs=False` its outputs stay on the worker and are
        dropped (TF's coordinator copies a function's outputs to the chief
        as soon as it finishes: a transfer per output tensor); its `result`
        is then None. Blocks while the window (`staleness_window`) is full,
        waiting for the oldest (bounded as `wait`).
        """
        window = staleness_window(
            self._max_staleness, max(steps_per_function, num_steps), self._max_in_flight
        )
        while len(self._in_flight) >= window:
            self.wait(self._in_flight[0])
        step = Step(
            index=self._count,
            scheduled_s=time.monotonic(),
            num_steps=num_steps,
            keep_outputs=keep_outputs,
        )
        self._count += 1
        step.remote = ps_runtime.schedule_python(
            self._coordinator, self._run, (step, function, tuple(args))
        )
        self._in_flight.append(step)
        return step

    def _run(self, step: Step, function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Runs in the coordinator's thread of the worker that took `step`."""
        with self._lock:
            step.worker = ps_runtime.current_worker_index()
            step.attempts += 1
            if step.attempts > 1:
                self.reruns += 1
                logging.warning(
                    "tfdist: step %d runs again, on worker:%d (attempt %d); its "
                    "previous worker failed.",
                    step.index,
                    step.worker,
                    step.attempts,
                )
            for other in self._running:
                other.overlap_steps += step.num_steps
                step.overlap_steps += other.num_steps
            self._running.add(step)
            step.started_s = time.monotonic()
        try:
            ran, result = self._call(step, function, args)
        finally:
            with self._lock:
                step.started_s = None
                self._running.discard(step)
        with self._lock:
            self.executions_by_worker[step.worker] += int(ran)
            self.largest_staleness_seen = max(self.largest_staleness_seen, step.overlap_steps)
        step.done.set()
        return result if step.keep_outputs else None

    def _call(
        self, step: Step, function: Callable[..., Any], args: tuple[Any, ...]
    ) -> tuple[bool, Any]:
        """(ran, outputs) of the step's function; a recorded one that had finished does not run."""
        if not isinstance(function, step_ledger.Recorded):
            return True, function(*args)
        ticket = step.index + 1
        if step.attempts > 1 and function.ledger.finished(ticket):
            with self._lock:
                self.reruns_skipped += 1
            logging.warning(
                "tfdist: step %d had finished on its worker before that worker "
                "failed; it is not run again.",
                step.index,
            )
            return False, None
        return True, function(ticket, *args)

    def result(self, step: Step) -> Any:
        """Waits for `step` (see `wait`); returns its outputs, copied to the chief.

        None for a recorded step that was not run again because it had
        finished (see module).
        """
        self.wait(step)
        return step.remote.get()

    def finished(self) -> list[Step]:
        """Steps found done by waits since the last call, oldest first."""
        found, self._finished = self._finished, []
        return found

    def wait(self, step: Step) -> None:
        """Blocks until `step` is done; raises if it cannot be (see module)."""
        while not step.done.wait(_POLL_S):
            self._check()
        self._last_progress_s = time.monotonic()
        while self._in_flight and self._in_flight[0].done.is_set():
            self._finished.append(self._in_flight.popleft())
            self.completed += 1

    def wait_all(self) -> None:
        """Blocks until every scheduled step is done (the epoch barrier)."""
        while self._in_flight:
            self.wait(self._in_flight[-1])
            for step in list(self._in_flight):
                self.wait(step)
        # Our closures are done; let TF's queue account for them (bounded).
        if not ps_runtime.wait_idle(self._coordinator, self._timeout_s):
            raise self._stuck_error("the coordinator's queue did not drain")

    def _check(self) -> None:
        """Raises the error that ends a wait, if any (see module)."""
        error = ps_runtime.pending_error(self._coordinator)
        if error is not None:
            self._raise_pending(error)
        if self._lost is not None:
            raise errors.WorkerUnavailableError(self._lost_reason, task=self._lost)
        now = time.monotonic()
        with self._lock:
            running = [
                s for s in self._in_flight if s.started_s is not None and not s.done.is_set()
            ]
        for step in running:
            assert step.started_s is not None
            if now - step.started_s > self._timeout_s:
                raise errors.CollectiveTimeoutError(
                    f"step {step.index} has run on worker:{step.worker} for more "
                    f"than timeout_s={self._timeout_s:g} s (attempt "
                    f"{step.attempts}): the worker is alive but stuck, or a "
                    "ps task it waits on is. Check worker:"
                    f"{step.worker}'s log; raise timeout_s if one step can "
                    "legitimately take longer. Restart the job (with "
                    "BackupAndRestore, it resumes).",
                    task=f"worker:{step.worker}",
                )
        if now - max(self._last_progress_s, self._in_flight[0].scheduled_s) > self._timeout_s:
            raise self._stuck_error("no worker finished a step")

    def _stuck_error(self, what: str) -> errors.CollectiveTimeoutError:
        missing = startup.unreachable_peers(self._config, jobs=("worker",))
        who = (
            f"lost worker(s): {', '.join(missing)}"
            if missing
            else "every worker accepts connections"
        )
        return errors.CollectiveTimeoutError(
            f"{what} within timeout_s={self._timeout_s:g} s ({who}). Workers "
            "that fail are waited for until they restart (tfdist-launch "
            "restarts them: --worker-restarts); check the workers' logs, or "
            "raise timeout_s.",
            task=missing[0].split(" ")[0] if missing else None,
        )

    def _raise_pending(self, error: BaseException) -> None:
        """Raises a scheduled function's error, a lost ps as tfdist's error."""
        lost = lost_ps_error(error)
        if lost is not None:
            raise lost from error
        self._wait_running_stopped()
        self._coordinator.done()  # Raises (and clears) TF's pending error.
        raise error

    def _wait_running_stopped(self) -> None:
        """After an error, waits (bounded) for running steps to end, as TF's queue does."""
        deadline = time.monotonic() + self._timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not any(s.started_s is not None for s in self._in_flight):
                    return
            time.sleep(_POLL_S)
        raise self._stuck_error("after a step failed, the other running steps did not end")

    def _probe_ps(self) -> None:
        """Background: TCP-probes every ps task; records the first lost one."""
        failures: dict[str, int] = collections.defaultdict(int)
        while not self._probe_stop.wait(_PROBE_INTERVAL_S):
            missing = startup.unreachable_peers(self._config, jobs=("ps",))
            names = {m.split(" ")[0]: m for m in missing}
            for name in list(failures):
                if name not in names:
                    failures.pop(name)
            for name, described in names.items():
                failures[name] += 1
                if failures[name] >= _PROBE_FAILURES:
                    self._lost_reason = (
                        f"parameter server {described} is lost: it refused "
                        f"connections in {_PROBE_FAILURES} probes "
                        f"{_PROBE_INTERVAL_S:g} s apart. Its variables are gone, "
                        "so training cannot go on; restart the job (tfdist-"
                        "launch --restarts N) and resume from the last "
                        "checkpoint (keras.callbacks.BackupAndRestore)."
                    )
                    logging.error("tfdist: WorkerUnavailableError: %s", self._lost_reason)
                    self._lost = name
                    return


def lost_ps_error(error: BaseException | None) -> errors.WorkerUnavailableError | None:
    """tfdist's error for TF's error of an op that could not reach a ps task; else None."""
    if not isinstance(error, ps_runtime.PSUnavailableError) and not (
        isinstance(error, tf.errors.UnavailableError) and _PS_TASK.search(str(error))
    ):
        return None
    match = _PS_TASK.search(str(error))
    task = f"ps:{match.group(1)}" if match else None
    return errors.WorkerUnavailableError(
        f"parameter server {task or '(unknown)'} is lost: an op could not "
        "reach it. Its variables are gone, so training cannot go on; restart "
        "the job (tfdist-launch --restarts N) and resume from the last "
        "checkpoint (keras.callbacks.BackupAndRestore). TensorFlow reported: "
        f"{_first_line(error)}",
        task=task,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
