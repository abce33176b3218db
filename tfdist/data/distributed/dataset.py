"""The distributed dataset tfdist strategies return: per-replica values from one host iterator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist._internal import variables
from tfdist.data.distributed import iterator_reaper
from tfdist.data.distributed import resume

__all__ = ["DistributedDataset"]


class DistributedDataset(tf.distribute.DistributedDataset):
    """A `tf.distribute.DistributedDataset` over a `tf.data` pipeline of per-replica values.

    Each element has the structure of the user's dataset, with every leaf a
    `PerReplica` of this worker's replicas' slices (as TF's distributed
    datasets yield). Iterating returns a plain `tf.data.Iterator` on the
    host: `next`, `get_next`, `get_next_as_optional`, and passing it into
    a `tf.function` work as for any `tf.data` iterator; each replica reads
    its slice from host memory (on accelerators the step copies it in).
    An iterator dropped by its last holder is destroyed on a tfdist thread
    (within 50 ms), not on the thread that dropped it.

    Contract: build it eagerly; every iteration is a new pass over the
    underlying pipeline (for a dataset served by the chief, a new
    tf.data-service job: every worker must create its iterators in the same
    order, as Keras and the same script on every worker do).

    A pass started while a `resume.ResumePoint` is armed (by
    `tfdist.elastic`) takes it: see `resumed`.

    Args:
      make_dataset: Returns the per-replica `tf.data.Dataset` for the next
        iteration; called once per `iter()`.
      element_spec: Its element spec.
      cardinality: Number of elements per iteration, or
        `tf.data.UNKNOWN_CARDINALITY` / `tf.data.INFINITE_CARDINALITY`.
      resumed: Given the point (epoch e, step k), returns the
        distributed dataset this one becomes for this pass and every later
        one: its first pass is epoch e from its step k. None: this pass
        skips its first k elements (global steps) and later passes are as
        before, which resumes exactly when every pass yields the same
        batches; an endless dataset (one pass read across every epoch)
        skips the point's `stream_step` instead.
      pass_epoch: For a pipeline whose passes are epochs (a sharder's),
        returns the epoch of the last pass that produced an element; each
        pass hands it to `resume.started`. None: passes are not numbered.
    """

    def __init__(
        self,
        make_dataset: Callable[[], tf.data.Dataset],
        *,
        element_spec: Any,
        cardinality: int,
        resumed: Callable[[resume.ResumePoint], DistributedDataset] | None = None,
        pass_epoch: Callable[[], int] | None = None,
    ) -> None:
        self._make_dataset = make_dataset
        self._element_spec = element_spec
        self._cardinality = cardinality
        self._resumed = resumed
        self._pass_epoch = pass_epoch
        # Set once a resume point was taken with `resumed`: every pass from
        # then on is this dataset's.
        self._resumed_as: DistributedDataset | None = None

    @classmethod
    def from_dataset(cls, dataset: tf.data.Dataset) -> DistributedDataset:
        """Wraps a per-replica `tf.data.Dataset` that every iteration reuses."""
        return cls(
            lambda: dataset,
            element_spec=dataset.element_spec,
            cardinality=int(dataset.cardinality()),
        )

    def __iter__(self) -> tf.data.Iterator:
        point = resume.take() if tf.executing_eagerly() else None
        if point is not None and self._resumed is not None:
            self._resumed_as = self._resumed(point)
        elif point is not None:
            self._make_dataset = _skipping_once(
                self._make_dataset, point.steps_to_skip(self._cardinality))
        if self._resumed_as is not None:
            return iter(self._resumed_as)
        if tf.executing_eagerly():
            resume.started(self._pass_epoch)
        iterator = iter(self._make_dataset())
        if tf.executing_eagerly():
            # Keras drops each epoch's iterator as it starts the next
            # epoch; destroying it can wait for tf.data's autotuning
            # thread (0.2-0.6 s), so it is destroyed on another thread.
            iterator_reaper.adopt(iterator)
        return iterator

    @property
    def element_spec(self) -> Any:
        """Nest of per-replica type specs, shaped like the user's elements."""
        return self._element_spec

    @property
    def cardinality(self) -> int:
        """Elements (global steps) per pass, as `tf.data` counts them."""
        return self._cardinality

    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        """Folds `reduce_func(state, element)` over one pass, as TF's does.

        Works eagerly and inside `tf.function` (where autograph turns
        `for x in dist_dataset` into this).
        """
        if self._resumed_as is not None:
            return self._resumed_as.reduce(initial_state, reduce_func)
        iterator = iter(self._make_dataset())

        def cond(optional: Any, state: Any) -> tf.Tensor:
            del state
            return optional.has_value()

        def body(optional: Any, state: Any) -> tuple[Any, Any]:
            state = reduce_func(state, optional.get_value())
            return iterator.get_next_as_optional(), state

        _, final_state = tf.while_loop(
            cond,
            body,
            [iterator.get_next_as_optional(), initial_state],
            parallel_iterations=1,
        )
        return final_state


def _skipping_once(
    make_dataset: Callable[[], tf.data.Dataset], steps: int
) -> Callable[[], tf.data.Dataset]:
    """`make_dataset` whose first pass to produce skips `steps` elements.

    Keras makes iterators it never reads (tf-keras one before its first
    epoch, Keras 3 one at each epoch end), so the skip is taken when a pass
    starts producing, not when it is created.
    """
    with tf.init_scope(), tf.device("/cpu:0"):
        pending = variables.make_local_counter("tfdist_resume_skip")
        pending.assign(steps)

    def skipping() -> tf.data.Dataset:
        dataset = make_dataset()
        return tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).map(
            _take_value(pending)
        ).flat_map(dataset.skip)

    return skipping


def _take_value(variable: tf.Variable) -> Callable[[tf.Tensor], tf.Tensor]:
    """A map function that returns `variable`'s value and sets it to 0."""

    @tf.autograph.experimental.do_not_convert
    def take(unused: tf.Tensor) -> tf.Tensor:
        del unused
        value = tf.identity(variable.read_value())
        with tf.control_dependencies([value]):
            cleared = variable.assign(0, read_value=False)
        with tf.control_dependencies([cleared]):
            return tf.identity(value)

    return take
