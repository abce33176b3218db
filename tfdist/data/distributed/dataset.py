"""The distributed dataset tfdist strategies return: per-replica values from one host iterator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist.data.distributed import iterator_reaper

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

    Args:
      make_dataset: Returns the per-replica `tf.data.Dataset` for the next
        iteration; called once per `iter()`.
      element_spec: Its element spec.
      cardinality: Number of elements per iteration, or
        `tf.data.UNKNOWN_CARDINALITY` / `tf.data.INFINITE_CARDINALITY`.
    """

    def __init__(
        self,
        make_dataset: Callable[[], tf.data.Dataset],
        *,
        element_spec: Any,
        cardinality: int,
    ) -> None:
        self._make_dataset = make_dataset
        self._element_spec = element_spec
        self._cardinality = cardinality

    @classmethod
    def from_dataset(cls, dataset: tf.data.Dataset) -> DistributedDataset:
        """Wraps a per-replica `tf.data.Dataset` that every iteration reuses."""
        return cls(
            lambda: dataset,
            element_spec=dataset.element_spec,
            cardinality=int(dataset.cardinality()),
        )

    def __iter__(self) -> tf.data.Iterator:
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
