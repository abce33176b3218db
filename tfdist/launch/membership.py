"""How many workers an elastic job runs: `--workers MIN:MAX`, a slots or hosts file.

    workers = WorkerRange.parse("2:4")        # MIN 2, MAX 4
    watcher = GrantWatcher(slots_grant("slots.txt", workers), current=4,
                           on_change=reform)
    watcher.start(); ...; watcher.stop()

The local launcher starts MAX workers (or as many as the slots file allows)
and changes the count between attempts (`restart.run_local_job`):

- a worker lost (it crashed or was killed) leaves the job one worker
  short: the next attempt runs one fewer, down to MIN;
- with a slots file (one integer, the worker slots this machine can give
  the job; re-read every `POLL_S`), a change of the count asks the running
  tasks to stop at a step boundary (SIGTERM: `tfdist.elastic.Elastic`
  saves there) and the next attempt runs min(slots, MAX) workers: a
  shrink without steps lost, or a grow;
- with a hosts file (`hosts.HostsFile`), the same when the hosts the tasks
  would run on change.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from typing import Any

from tfdist import errors

__all__ = ["POLL_S", "GrantWatcher", "WorkerRange", "read_slots", "slots_grant"]

#: How often a `GrantWatcher` re-reads its source, in seconds.
POLL_S = 0.5


@dataclasses.dataclass(frozen=True)
class WorkerRange:
    """The workers a job may run with: at least `minimum`, at most `maximum`.

    Raises:
      LauncherError: If minimum < 1 or maximum < minimum.
    """

    minimum: int
    maximum: int

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise errors.LauncherError(
                f"expected 1 <= MIN <= MAX workers; received --workers "
                f"{self.minimum}:{self.maximum}. Pass e.g. --workers 2:4."
            )

    @classmethod
    def parse(cls, text: str) -> WorkerRange:
        """`"N"` (exactly N) or `"MIN:MAX"`.

        Raises:
          LauncherError: If `text` is neither, or the numbers are out of range.
        """
        parts = text.split(":")
        try:
            numbers = [int(part) for part in parts]
        except ValueError:
            numbers = []
        if len(numbers) == 1 and numbers[0] < 1:
            raise errors.LauncherError(
                f"expected an integer >= 1, received --workers {text!r}. Pass "
                "e.g. --workers 2 (or --workers 2:4 for an elastic job)."
            )
        if len(numbers) not in (1, 2):
            raise errors.LauncherError(
                f"expected a number of workers or MIN:MAX; received --workers "
                f"{text!r}. Pass e.g. --workers 2, or --workers 2:4 for a job "
                "that runs on 2 to 4 workers."
            )
        return cls(numbers[0], numbers[-1])

    @property
    def is_elastic(self) -> bool:
        """Whether the count may change (MIN < MAX)."""
        return self.minimum < self.maximum

    def __str__(self) -> str:
        return f"{self.minimum}:{self.maximum}" if self.is_elastic else str(self.maximum)


def read_slots(path: str) -> int | None:
    """The slots `path` grants (a non-negative integer); None if it is missing or not one."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    try:
        slots = int(text)
    except ValueError:
        return None
    return slots if slots >= 0 else None


class GrantWatcher:
    """Calls `on_change(grant)` once when `read()` returns a grant other than `current`.

    What a grant is depends on the source: `slots_grant`'s is a worker
    count; a hosts file's (`hosts.HostsFile.grant`) is where the tasks would
    run. `read` returns None when the source is missing or unreadable (a
    file being rewritten): that changes nothing.

    Contract: `start` once, `stop` when the attempt ends (idempotent).
    `read` and `on_change` run on the watcher's thread, `on_change` at most
    once; `target` then holds the grant it was called with.

    Args:
      read: Returns the grant now, or None; polled every `POLL_S`.
      current: The attempt's grant.
      on_change: Called with the new grant.
    """

    def __init__(
        self,
        read: Callable[[], Any],
        *,
        current: Any,
        on_change: Callable[[Any], None],
    ) -> None:
        self._read = read
        self._current = current
        self._on_change = on_change
        self._stopped = threading.Event()
        self.target: Any = None
        self._thread = threading.Thread(
            target=self._run, name="tfdist-launch-grant", daemon=True
        )

    def start(self) -> None:
        """Starts watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stops watching; waits for the thread."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(POLL_S):
            try:
                grant = self._read()
            except Exception as e:  # noqa: BLE001 - a source that fails grants nothing new.
                sys.stderr.write(f"tfdist-launch: could not read the job's slots: {e}\n")
                continue
            if grant is not None and grant != self._current:
                self.target = grant
                self._on_change(grant)
                return


def slots_grant(path: str, workers: WorkerRange) -> Callable[[], int | None]:
    """A `GrantWatcher` source: min(the slots file's count, `workers.maximum`).

    The count is still reported below `workers.minimum` (the launcher then
    stops the job).
    """

    def read() -> int | None:
        slots = read_slots(path)
        return None if slots is None else min(slots, workers.maximum)

    return read
