"""One-time inspection of the sharder's input: sizes, bytes, first element.

Everything here runs eagerly, once, when `shard` builds a pipeline; the
returned values are Python/numpy values or eager tensors captured by the
pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist import errors

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any

# The functions below have no Python control flow on tensors; skipping
# AutoGraph's conversion makes them faster to trace.
_no_autograph = tf.autograph.experimental.do_not_convert

#: Elements sampled to estimate the byte size of elements that hold strings.
_SIZE_SAMPLE_ELEMENTS = 256


def count_elements(dataset: tf.data.Dataset) -> tuple[int, bool]:
    """Returns (number of elements, whether a full pass was needed to count).

    Raises:
      ConfigError: If the dataset is infinite.
    """
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise errors.ConfigError(
            "dataset is infinite (cardinality=tf.data.INFINITE_CARDINALITY); "
            "tfdist.data.shard needs a finite dataset to define an epoch. "
            "Remove .repeat() before sharding (Keras iterates the sharded "
            "dataset once per epoch)."
        )
    if cardinality >= 0:
        return cardinality, False
    counted = dataset.reduce(
        tf.constant(0, tf.int64), _no_autograph(lambda count, _: count + 1)
    )
    return int(counted), True


def first_element(dataset: tf.data.Dataset) -> Nested:
    """Returns the first element of a non-empty dataset (eager tensors)."""
    return dataset.take(1).get_single_element()


def zeros_like_element(element: Nested) -> Nested:
    """Returns zeros (empty strings, False) shaped like `element`."""
    return tf.nest.map_structure(tf.zeros_like, element)


def element_bytes(dataset: tf.data.Dataset, num_elements: int) -> int:
    """Estimates bytes per element, exactly for fixed-size numeric elements.

    Components whose size is not static (strings, unknown shapes) are
    measured on the first few elements.

    Args:
      dataset: A finite, non-empty dataset of dense tensors.
      num_elements: Its number of elements.

    Returns:
      Bytes per element, >= 1.
    """
    specs = tf.nest.flatten(dataset.element_spec)
    if all(s.shape.is_fully_defined() and s.dtype != tf.string for s in specs):
        return max(
            1,
            sum(s.shape.num_elements() * s.dtype.size for s in specs),
        )
    sample_size = min(num_elements, _SIZE_SAMPLE_ELEMENTS)
    sample = dataset.take(sample_size).batch(sample_size).get_single_element()
    total = 0
    for array in tf.nest.flatten(sample):
        values = array.numpy()
        if values.dtype == object:  # Strings: count the bytes themselves.
            total += sum(len(v) for v in values.reshape(-1))
        else:
            total += values.nbytes
    return max(1, -(-total // sample_size))


def materialize(dataset: tf.data.Dataset, num_elements: int) -> Nested:
    """Reads the whole dataset once into tensors with a leading dimension.

    Returns:
      The dataset's structure of tensors, each `[num_elements + 1, ...]`:
      the elements in order, then one row of zeros (the padding row).
    """
    data = dataset.batch(num_elements).get_single_element()
    return tf.nest.map_structure(
        lambda t: tf.concat([t, tf.zeros_like(t[:1])], axis=0), data
    )


def count_records(
    files: Sequence[str],
    reader: Callable[[tf.Tensor], tf.data.Dataset],
) -> np.ndarray:
    """Counts the records of every file once (files read in parallel).

    Returns:
      int64 array `[len(files)]`, in the order of `files`.
    """

    def count(path: tf.Tensor) -> tf.Tensor:
        return reader(path).reduce(
            tf.constant(0, tf.int64), _no_autograph(lambda n, _: n + 1)
        )

    counts = tf.data.Dataset.from_tensor_slices(list(files)).map(
        _no_autograph(count),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return np.fromiter(counts.as_numpy_iterator(), dtype=np.int64)
