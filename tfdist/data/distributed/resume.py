"""Where the next training pass over a tfdist distributed dataset starts.

    resume.arm(ResumePoint(epoch=3, step=40))   # tfdist.elastic, on resuming
    iter(distributed_dataset)                   # this pass: epoch 3 from step 40
    resume.disarm()                             # True if no pass took it

`tfdist.elastic.Elastic` restores a model saved in the middle of epoch e,
after k of its steps, and arms the point (e, k) before `fit`'s first
training pass starts. The next `DistributedDataset` pass of this process
takes it: a plain pipeline skips its first k global batches (the batches
of a pass are the same whatever the number of workers, so the rest of the
epoch is re-partitioned over the workers there are now), an endless one
(read across epochs) the steps of every epoch before too; a pipeline that
tfdist shards itself (`ShardOptions`) starts at epoch e's permutation,
step k, and numbers later passes e + 1, e + 2, ... The point is taken once.

Process-wide on purpose: the callback that arms it and the dataset that
takes it do not know each other (Keras builds the dataset before any
callback runs). Keras 3 takes one batch to build an unbuilt model before
`on_train_begin`; that pass is over before the point is armed.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

__all__ = ["ResumePoint", "arm", "disarm", "last_epoch", "started", "take"]

#: `tf.data.INFINITE_CARDINALITY` (this module imports nothing from TensorFlow).
_INFINITE = -1


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """A position in training: `step` steps of epoch `epoch` are done.

    Attributes:
      epoch: The epoch (0-based) the next pass is.
      step: Global steps of that epoch already trained; the pass starts at
        this step.
      stream_step: Global steps trained since the job began, all epochs:
        where an endless input (a `.repeat()`ed pipeline under
        `steps_per_epoch`, one pass read across every epoch) starts.
    """

    epoch: int
    step: int
    stream_step: int | None = None

    def steps_to_skip(self, cardinality: int) -> int:
        """Global batches a plain pass of `cardinality` elements skips to start here.

        An endless pass (`tf.data.INFINITE_CARDINALITY`, read across every
        epoch under `steps_per_epoch`) skips every step trained since the
        job began (`stream_step`); any other pass the steps of its epoch.
        """
        if cardinality == _INFINITE and self.stream_step is not None:
            return self.stream_step
        return self.step


_lock = threading.Lock()
_armed: ResumePoint | None = None
_last_pass_epoch: Callable[[], int] | None = None


def arm(point: ResumePoint) -> None:
    """Makes `point` where the next distributed-dataset pass of this process starts."""
    global _armed
    with _lock:
        _armed = point


def take() -> ResumePoint | None:
    """The armed point, which is then no longer armed; None if none is."""
    global _armed
    with _lock:
        point, _armed = _armed, None
    return point


def disarm() -> bool:
    """Clears the armed point; True if one was armed (no pass took it)."""
    return take() is not None


def started(pass_epoch: Callable[[], int] | None) -> None:
    """Records that a pass began: how to read its sharder's epoch, or None (a plain pipeline)."""
    global _last_pass_epoch
    with _lock:
        _last_pass_epoch = pass_epoch


def last_epoch() -> int | None:
    """The sharder's epoch of the last pass begun, once it has produced; None if not sharded."""
    with _lock:
        pass_epoch = _last_pass_epoch
    return None if pass_epoch is None else pass_epoch()
