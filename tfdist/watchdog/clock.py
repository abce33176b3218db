"""The started/finished counts that bound a process's cross-task collectives.

Two host counters bracket every collective: `before` counts one started
once the collective's input exists (so compute that produces the input is
not counted as waiting), `after` counts one finished once its result
exists. A collective is in flight while started > finished. The counters
cost two scalar increments per collective; TF's own per-collective
`timeout` instead starts threads per collective that sleep for the whole
timeout, which a long job would pay with Linux's thread and memory-map
limits (benchmarks/RESULTS.md, "Multi-worker scaling").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import tensorflow as tf

from tfdist._internal import variables

__all__ = ["CollectiveClock"]

_T = TypeVar("_T")


class CollectiveClock:
    """Counts the cross-task collectives this process started and finished.

    Contract: built eagerly, inside a strategy scope or not (the counters
    bypass variable creators). `before` and `after` are called when a
    collective is created, in a `tf.function` or eagerly; `watch_eager`
    runs a blocking eager call that holds collectives (e.g. a variable's
    initial-value broadcast); `counts` may be called from any thread at any
    time.

    A call that fails can leave collectives counted as started that will
    never finish; `resync` (called after any failed `tf.function` call or
    eager collective, when none of them can still be running) forgets them.

    Args:
      device: Where the two int64 counters live (this task's CPU).
    """

    def __init__(self, device: str) -> None:
        with tf.init_scope(), tf.device(device):
            self._started = variables.make_local_counter("tfdist_collectives_started")
            self._finished = variables.make_local_counter("tfdist_collectives_finished")

    def before(self, tensor: tf.Tensor) -> tf.Tensor:
        """`tensor`, passed on once computed and counted as started."""
        with tf.control_dependencies([tensor]):
            started = self._started.assign_add(1)
        with tf.control_dependencies([started]):
            return tf.identity(tensor)

    def after(self, tensor: tf.Tensor) -> tf.Tensor:
        """`tensor`; the finished count goes up once it is computed."""
        with tf.control_dependencies([tensor]):
            self._finished.assign_add(1)
        return tensor

    def watch_eager(self, call: Callable[[], _T]) -> _T:
        """Runs `call()` counted as one collective in flight (eagerly).

        Inside a `tf.function` (a variable created while tracing) `call` is
        traced as is: its collective is then bounded only by lost-peer
        probes. If `call` raises, the counts are resynced.
        """
        if not tf.executing_eagerly():
            return call()
        self._started.assign_add(1)
        try:
            result = call()
        except BaseException:
            self.resync()
            raise
        self._finished.assign_add(1)
        return result

    def counts(self) -> tuple[int, int]:
        """(started, finished) so far; started > finished: one in flight."""
        return int(self._started.numpy()), int(self._finished.numpy())

    def resync(self) -> None:
        """Counts every started collective as finished (see class docstring)."""
        self._finished.assign(self._started.read_value())


