"""Per-row sample weights on Keras-style batches, shared by the input paths.

`shard` (padded or split last step), `split_batches` (uneven per-replica
slices) and tfdist strategies' Keras train steps give each real row of a per-replica batch a loss weight
chosen so that Keras's default "sum_over_batch_size" reduction, summed over
replicas after its 1 / num_replicas scaling, is the mean loss over the real
rows of the global step. This module only attaches those weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FactorFn", "is_keras_tuple", "ratio", "with_row_weights"]

import tensorflow as tf

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any

#: Maps a weight dtype to the `[b]` row factors in that dtype.
FactorFn = Callable[[tf.DType], tf.Tensor]


def is_keras_tuple(element: Nested) -> bool:
    """Whether `element` is `(x, y)` or `(x, y, sample_weight)`."""
    return isinstance(element, tuple) and len(element) in (2, 3)


def ratio(
    numerator: tf.Tensor, denominator: tf.Tensor, dtype: tf.DType
) -> tf.Tensor:
    """`numerator / denominator` rounded once to `dtype`.

    Computed in float64 for float64 weights, else in float32 (half-precision
    weights get the float32 quotient rounded). A zero denominator gives 0;
    callers use it only where the quotient is discarded or multiplies no row.
    """
    compute_dtype = tf.float64 if dtype == tf.float64 else tf.float32
    return tf.cast(
        tf.math.divide_no_nan(
            tf.cast(numerator, compute_dtype), tf.cast(denominator, compute_dtype)
        ),
        dtype,
    )


def with_row_weights(
    batch: Nested, factor_fn: FactorFn, *, keep_integer_weights: bool = False
) -> Nested:
    """Returns `(x, y, weight)`: the batch with row factors as sample weight.

    Args:
      batch: `(x, y)` or `(x, y, sample_weight)` with leading dimension b.
      factor_fn: Returns the `[b]` factors in a given dtype; a given sample
        weight is multiplied by them (broadcast over its trailing dims).
      keep_integer_weights: Keep an integer sample weight integer (for 0/1
        factors); otherwise it is cast to float32 first.
    """
    if len(batch) == 2:
        x, y = batch
        return x, y, factor_fn(tf.float32)
    x, y, weight = batch

    def scaled(w: tf.Tensor) -> tf.Tensor:
        if not (keep_integer_weights or w.dtype.is_floating):
            w = tf.cast(w, tf.float32)
        factor = factor_fn(w.dtype)
        shape = tf.concat(
            [tf.shape(factor), tf.ones([tf.rank(w) - 1], tf.int32)], axis=0
        )
        return w * tf.reshape(factor, shape)

    return x, y, tf.nest.map_structure(scaled, weight)
