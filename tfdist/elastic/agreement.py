"""At which step every task stops after a preemption notice, without a collective per step.

    agreement = ClusterAgreement("worker:0", ["worker:0", "worker:1"], fit_index=0)
    agreement.start()
    ...  # each step end, on the training thread:
    if agreement.should_stop(steps_done, notice.requested): save(); stop()
    agreement.stop()

A notice (SIGTERM) may reach one task or all, at different steps. Stopping
where each task sees it would leave some tasks inside a collective that
the others never join. The tasks agree through TF's coordination service
(the key-value store tfdist's multi-worker strategy configures), and the
training thread only reads local flags until a notice exists, so steady
state costs nothing (no extra collective).

Protocol (keys under `tfdist/elastic/<n>/`, n counting the `fit` calls of the
process, the same on every task):

1. A task that receives the notice sets `stop` (the first writer wins). A
   watcher thread in every task waits on that key and raises a local flag.
2. At its first step end with a flag raised, a task publishes `at/<task>`:
   the training steps it has completed (`steps_done`), then trains on.
3. Once every task has published, the stop step is S = max(at) + 1, and
   each task stops at its first step end with `steps_done >= S`. At the step
   end where a task publishes, it reads the others' reports with a short
   wait; later, with a wait that outlasts the service's round trip.

Why every task stops at S exactly: a task cannot complete step t + 1 unless
every other task has started it, that is, has finished its step end t
(where it publishes if it saw the flag). The last task to publish, at step
r <= max(at), did so before starting step r + 1, so every task sees all
reports at the end of step r + 1 <= S at the latest; and no task passes S
without having seen them. A task that published at step t has S >= t + 1,
so a report its short read at t missed is read, with the long wait, at
t + 1 <= S. Steps are counted from the start of `fit`, the
same on every task.

`LocalAgreement` is the one-process case: stop at the next step end.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence

import tensorflow as tf

from tfdist import errors
from tfdist._internal import coordination

__all__ = ["ClusterAgreement", "LocalAgreement"]

_STOP_KEY = "tfdist/elastic/{fit}/stop"
_RESTORED_KEY = "tfdist/elastic/{fit}/restored"
_AT_KEY = "tfdist/elastic/{fit}/at/{task}"
#: How long the watcher's read of the stop key waits (it returns as soon as
#: the key is set; TF's read releases the interpreter lock while it waits).
_WATCH_S = 1.0
#: How long a read of a peer's report waits. A read that times out is taken
#: as "not published yet": it must outlast the service's round trip, or a
#: published report could be missed (and that task would stop a step late).
_REPORT_S = 1.0
#: How long the reads wait at the step end where a task publishes its own
#: report: a peer that has not seen the notice publishes only after the next
#: step, which waits for this task, so a long wait there stalls every task
#: (it cost ~0.8 s per notice). A report missed there is read at the next
#: step end, which is still at or before the stop step (see the module).
_FIRST_REPORT_S = 0.05


class LocalAgreement:
    """One process: stop at the first step end after the notice."""

    def start(self) -> None:
        """Nothing to start."""

    def check_same_state(self, state: str, *, is_writer: bool, timeout_s: float) -> None:
        """Nothing to compare with."""
        del state, is_writer, timeout_s

    def stop(self) -> None:
        """Nothing to stop."""

    def should_stop(self, steps_done: int, requested_here: bool) -> bool:
        """Whether to stop now, after `steps_done` steps."""
        del steps_done
        return requested_here


class ClusterAgreement:
    """The tasks of a multi-worker job agree on one stop step (see module).

    Contract: every training task of the job builds one with the same
    `tasks`, calls `start` before its first step and `should_stop` at every
    step end with the same count on every task, from the training thread;
    `stop` ends the watcher (idempotent). Requires TF's coordination service
    (tfdist's `MultiWorkerMirroredStrategy` configures it).

    Args:
      task: This task's name, "worker:1".
      tasks: Every training task's name.
      fit_index: Which `fit` of the process this is (0, 1, ...): each has
        keys of its own, so a notice left over from an earlier `fit` does
        not stop a later one.
    """

    def __init__(self, task: str, tasks: Sequence[str], *, fit_index: int = 0) -> None:
        self._task = task
        self._tasks = tuple(tasks)
        self._stop_key = _STOP_KEY.format(fit=fit_index)
        self._restored_key = _RESTORED_KEY.format(fit=fit_index)
        self._at_key = functools.partial(_AT_KEY.format, fit=fit_index)
        self._remote = threading.Event()
        self._ended = threading.Event()
        self._announced = False
        self._published = False
        self._reports: dict[str, int] = {}
        self.stop_step: int | None = None
        self._watcher = threading.Thread(
            target=self._watch, name="tfdist-elastic-watcher", daemon=True
        )

    def start(self) -> None:
        """Starts the watcher thread."""
        self._watcher.start()

    def check_same_state(self, state: str, *, is_writer: bool, timeout_s: float) -> None:
        """Checks that this task restored the state the writer (chief) restored.

        Every task calls it after restoring, with the committed state's name
        ("" for none). The writer publishes its name; every other task waits
        for it (at most `timeout_s`) and compares.

        Raises:
          ConfigError: If this task found another state: `backup_dir` is
            not storage every task shares (a local path on each machine).
          CollectiveTimeoutError: If the writer published nothing in time.
        """
        if is_writer:
            coordination.set_key(self._restored_key, state)
            return
        theirs = coordination.get_key(self._restored_key, timeout_s=timeout_s)
        if theirs is None:
            raise errors.CollectiveTimeoutError(
                f"task {self._task} waited {timeout_s:g} s for the chief to say which "
                "training state it restored; it did not. Check the chief's output.",
            )
        if theirs != state:
            raise errors.ConfigError(
                f"task {self._task} found the training state {state or 'none'!r} in "
                f"backup_dir, the chief {theirs or 'none'!r}: every task must read the "
                "same backup_dir (storage all tasks share, such as a network file "
                "system or a volume every pod mounts). Pass such a path."
            )

    def stop(self) -> None:
        """Ends the watcher thread (within about a second)."""
        self._ended.set()

    def should_stop(self, steps_done: int, requested_here: bool) -> bool:
        """Whether this task stops now, having completed `steps_done` steps."""
        if requested_here and not self._announced:
            self._announced = True
            try:
                coordination.set_key(self._stop_key, self._task)
            except tf.errors.AlreadyExistsError:
                pass  # Another task announced first.
        if not (requested_here or self._remote.is_set()):
            return False
        wait_s = _REPORT_S
        if not self._published:
            self._published = True
            coordination.set_key(self._at_key(task=self._task), str(steps_done))
            self._reports[self._task] = steps_done
            wait_s = _FIRST_REPORT_S
        if self.stop_step is None:
            for task in self._tasks:
                if task not in self._reports:
                    value = coordination.get_key(self._at_key(task=task), timeout_s=wait_s)
                    if value is None:
                        return False
                    self._reports[task] = int(value)
            self.stop_step = max(self._reports.values()) + 1
        return steps_done >= self.stop_step

    def check_for_notice(self, timeout_s: float = 0.001) -> bool:
        """Reads the stop key once, waiting up to `timeout_s`; True once a task has announced."""
        if not self._remote.is_set() and coordination.get_key(self._stop_key, timeout_s=timeout_s) is not None:
            self._remote.set()
        return self._remote.is_set()

    def _watch(self) -> None:
        while not self._ended.is_set():
            started = time.monotonic()
            if self.check_for_notice(_WATCH_S):
                return
            if time.monotonic() - started < _WATCH_S / 2:
                self._ended.wait(_WATCH_S / 4)  # The service answered at once (it is gone).
