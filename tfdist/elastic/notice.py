"""A preemption notice: SIGTERM turned into a flag the training loop reads at step boundaries.

    notice = PreemptionNotice()
    notice.install()        # main thread; SIGTERM now sets the flag
    ...                     # each step end: if notice.requested: save, stop
    notice.uninstall()      # the previous handler is back

Kubernetes, Slurm and cloud spot reclaims all announce a preemption with
SIGTERM and kill the process (SIGKILL) after a grace period. Python's
default for SIGTERM ends the process at once, mid-step, with nothing
saved; the handler here only records the notice, so that training can
stop at the next step boundary, save and exit inside the grace period.

This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import signal
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from absl import logging

__all__ = ["PreemptionNotice"]


class PreemptionNotice:
    """Records SIGTERM (the preemption notice) instead of dying of it.

    Contract: `install` and `uninstall` from the main thread (elsewhere they
    do nothing but log: Python delivers signals to the main thread only, and
    then the notice comes only through `request`). While installed, SIGTERM
    sets `requested`; a second SIGTERM changes nothing. `uninstall` puts back
    the handler that was there before.

    Args:
      is_active: Given the main thread's frame when SIGTERM arrives, whether
        training is still under way there. If not (a `fit` that raised
        never tells its callbacks it ended), the previous handler is put
        back and gets this SIGTERM, as if none had been installed. None:
        always a notice.
    """

    def __init__(self, is_active: Callable[[types.FrameType | None], bool] | None = None) -> None:
        self._is_active = is_active
        self._requested = threading.Event()
        self._previous: Any = None
        self._installed = False
        self.received_at: float | None = None

    @property
    def requested(self) -> bool:
        """Whether a notice arrived (SIGTERM, or `request`)."""
        return self._requested.is_set()

    def request(self) -> None:
        """Records a notice as SIGTERM would (any thread)."""
        if not self._requested.is_set():
            self.received_at = time.monotonic()
        self._requested.set()

    def install(self) -> None:
        """Makes SIGTERM call `request` (main thread only; idempotent)."""
        if self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            logging.warning(
                "tfdist.elastic: fit runs outside the main thread, so SIGTERM "
                "cannot be caught there; a preemption notice then ends the "
                "process unsaved."
            )
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._installed = True

    def uninstall(self) -> None:
        """Restores the SIGTERM handler `install` replaced (idempotent)."""
        if not self._installed:
            return
        previous = signal.SIG_DFL if self._previous is None else self._previous
        signal.signal(signal.SIGTERM, previous)
        self._installed = False

    def _handle(self, signal_number: int, frame: types.FrameType | None) -> None:
        if self._is_active is not None and not self._is_active(frame):
            self.uninstall()
            signal.raise_signal(signal_number)  # To the handler that was there before.
            return
        if not self._requested.is_set():
            logging.warning(
                "tfdist.elastic: SIGTERM received; training stops at the next "
                "step boundary every task agrees on, saves and exits 143."
            )
        self.request()
