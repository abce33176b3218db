"""What `shard` yields for a remainder: real rows, padding and their loss weights."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist.data import _plan
from tfdist.data import row_weights
from tfdist.data.policies import Remainder

__all__ = ["finish"]

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any


def finish(
    batches: tf.data.Dataset,
    remainder: Remainder,
    *,
    layout: _plan.ReplicaLayout,
    normalize_padded_loss: bool,
) -> tf.data.Dataset:
    """Maps `(batch, is_real, M_k)` to what `shard` yields for `remainder`."""
    global_batch_size = layout.global_batch_size
    num_replicas = layout.num_replicas_in_sync

    @tf.autograph.experimental.do_not_convert
    def padded(batch: Nested, is_real: tf.Tensor, num_real: tf.Tensor) -> Nested:
        def factors(dtype: tf.DType) -> tf.Tensor:
            if not normalize_padded_loss:
                return tf.cast(is_real, dtype)
            scale = row_weights.ratio(global_batch_size, num_real, dtype)
            return tf.where(is_real, scale, tf.zeros([], dtype))

        return row_weights.with_row_weights(
            batch, factors, keep_integer_weights=not normalize_padded_loss
        )

    @tf.autograph.experimental.do_not_convert
    def split(batch: Nested, is_real: tf.Tensor, num_real: tf.Tensor) -> Nested:
        rows = tf.nest.map_structure(
            lambda t: tf.boolean_mask(t, is_real), batch
        )
        if not row_weights.is_keras_tuple(rows):
            return rows
        num_rows = tf.reduce_sum(tf.cast(is_real, tf.int64))

        def factors(dtype: tf.DType) -> tf.Tensor:
            if not normalize_padded_loss:
                return tf.ones([num_rows], dtype)
            scale = row_weights.ratio(num_replicas * num_rows, num_real, dtype)
            return tf.fill([num_rows], scale)

        return row_weights.with_row_weights(
            rows, factors, keep_integer_weights=not normalize_padded_loss
        )

    if remainder is Remainder.PAD:
        out = batches.map(padded)
    elif remainder is Remainder.SPLIT:
        out = batches.map(split)
    else:
        out = batches.map(
            tf.autograph.experimental.do_not_convert(
                lambda batch, is_real, num_real_in_step: batch
            )
        )
    return out.prefetch(tf.data.AUTOTUNE)
