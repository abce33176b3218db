"""Splits an already-batched dataset's global batches over replicas, exactly.

`split_batches` splits a user's batched dataset as tfdist's strategies split
a plain dataset given to `model.fit`, `evaluate` or `predict` (their input
path, `tfdist/data/distributed/`, cuts each batch with this module's `slice_bounds`,
`batch_rows` and `take_rows`): the user's pipeline (its order, its own
per-epoch shuffling, its batch size) is kept, and every global batch is
cut into per-replica slices. G replicas in sync, P input pipelines of
R = G / P local replicas each; a global batch of m rows (m may vary, e.g. a
last partial batch)::

    slice s gets rows [s * q + min(s, e), ...) of length q + (s < e),
        where q = m // G and e = m % G
    pipeline p feeds its local replica r with slice s = r * P + p
    Keras-style (x, y[, w]) elements gain sample weight G * b_s / m for the
        b_s rows of slice s (1.0 when G divides m; a given weight is
        multiplied)

The slice order is the one Keras expects when it concatenates `predict`
outputs across workers (local replica r of every worker, then r + 1), so
`predict` returns the rows in input order. The weights make Keras's default
loss reduction (each replica divides by its own row count, then 1 / G)
equal the mean over the m rows, as one device training on that batch
computes: sum_s (G * b_s / m) * sum_{i in s}(loss_i) / (b_s * G) = mean.
There are no padding rows, so unweighted metrics and `predict` see each
example exactly once.

Every pipeline reads every batch (as TF's `AutoShardPolicy.DATA`), so all
workers must produce the same batches: a deterministic input, or shuffling
with the same seed on every worker. For per-epoch reshuffling computed by
tfdist, and reading only a pipeline's share of files, use `shard`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist import _validation as validation
from tfdist.data import _checks
from tfdist.data import row_weights

__all__ = ["batch_rows", "slice_bounds", "slice_sizes", "split_batches", "take_rows", "take_slices"]

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any


def split_batches(
    dataset: tf.data.Dataset,
    input_context: tf.distribute.InputContext | None,
    *,
    weight_uneven: bool = True,
) -> tf.data.Dataset:
    """Returns this pipeline's per-replica slices of `dataset`'s batches.

    Call it from the `dataset_fn` of
    `strategy.distribute_datasets_from_function`, once per input pipeline;
    tfdist strategies do so for a plain dataset. For each batch of
    `dataset` the result yields R consecutive elements, this pipeline's
    local replicas in order (see the module docstring for which rows).

    Args:
      dataset: A `tf.data.Dataset` of batches: dense tensors whose first
        dimension is the batch (the same length in every component).
        Elements `(x, y)` or `(x, y, sample_weight)` gain or scale a sample
        weight; anything else (e.g. `x` alone, for `predict`) is only split.
      input_context: The `tf.distribute.InputContext` the strategy passes;
        `None` means one pipeline feeding one replica.
      weight_uneven: If true (default), Keras-style elements get the weights
        of the module docstring; if false, weight 1 (a batch that G does not
        divide then trains on a slightly different mean).

    Returns:
      A dataset of per-replica batches with an unknown batch dimension; a
      replica's slice may have no rows when a batch has fewer than G rows.

    Raises:
      TypeError: If an argument has the wrong type.
      ConfigError: If the elements are not dense batched tensors.
    """
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            "dataset must be a tf.data.Dataset of batches; received "
            f"dataset={dataset!r} of type {type(dataset).__name__}."
        )
    validation.check_bool("weight_uneven", weight_uneven)
    num_replicas, num_pipelines, pipeline_id = _checks.check_input_context(
        input_context
    )
    _checks.check_dense_elements(dataset.element_spec)
    for spec in tf.nest.flatten(dataset.element_spec):
        if spec.shape.rank == 0:
            raise errors.ConfigError(
                "split_batches needs batched elements (a leading batch "
                f"dimension); received a scalar component with spec {spec!r}. "
                "Call dataset.batch(global_batch_size) first."
            )

    local_replicas = num_replicas // num_pipelines

    def replica_slice(batch: Nested, local_replica: tf.Tensor | int) -> Nested:
        rows = batch_rows(batch)
        index = local_replica * num_pipelines + pipeline_id
        start, size = slice_bounds(rows, index, num_replicas)
        part = take_rows(batch, start, size)
        if not row_weights.is_keras_tuple(part):
            return part

        def factors(dtype: tf.DType) -> tf.Tensor:
            if not weight_uneven:
                return tf.ones([size], dtype)
            return tf.fill([size], row_weights.ratio(num_replicas * size, rows, dtype))

        return row_weights.with_row_weights(part, factors)

    def as_batch(components: tuple[Nested, ...]) -> Nested:
        return components[0] if len(components) == 1 else components

    if local_replicas == 1:
        # One replica per pipeline (e.g. one pipeline per host-memory
        # device): a plain map, no per-batch dataset.
        return dataset.map(
            tf.autograph.experimental.do_not_convert(
                lambda *components: replica_slice(as_batch(components), 0)
            )
        ).prefetch(tf.data.AUTOTUNE)

    @tf.autograph.experimental.do_not_convert
    def replica_slices(*components: Nested) -> tf.data.Dataset:
        batch = as_batch(components)
        return tf.data.Dataset.range(local_replicas).map(
            tf.autograph.experimental.do_not_convert(
                lambda local_replica: replica_slice(batch, local_replica)
            )
        )

    return dataset.flat_map(replica_slices).prefetch(tf.data.AUTOTUNE)


def batch_rows(batch: Nested) -> tf.Tensor:
    """Rows of a batch (its first component's leading dimension), int64."""
    first = tf.nest.flatten(batch)[0]
    if isinstance(first, tf.RaggedTensor):
        return first.nrows(out_type=tf.int64)
    return tf.shape(first, out_type=tf.int64)[0]


def slice_bounds(
    rows: tf.Tensor, index: tf.Tensor | int, num_slices: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """(start, size) of slice `index` when `rows` rows are cut `num_slices` ways.

    Slices are contiguous and in order; the first `rows % num_slices` slices
    get one row more than the others (`rows // num_slices`), so sizes
    differ by at most one and a slice may be empty when `rows < num_slices`.
    """
    quotient = rows // num_slices
    extra = rows % num_slices
    index = tf.cast(index, tf.int64)
    start = index * quotient + tf.minimum(index, extra)
    size = quotient + tf.cast(index < extra, tf.int64)
    return start, size


def slice_sizes(rows: tf.Tensor, num_slices: int) -> tf.Tensor:
    """The sizes of all `num_slices` slices `slice_bounds` cuts `rows` rows into (int64)."""
    extra = rows % num_slices
    ahead = tf.cast(tf.range(num_slices, dtype=tf.int64) < extra, tf.int64)
    return rows // num_slices + ahead


def take_slices(
    batch: Nested, rows: tf.Tensor, indices: list[int], num_slices: int
) -> list[Nested]:
    """Slices `indices` of `batch`, cut `num_slices` ways as `slice_bounds` cuts.

    The same rows as `take_rows(batch, *slice_bounds(rows, i, num_slices))`
    for each `i` in `indices`, in a few ops per component (one split of
    each dense tensor, instead of a bound computation and a strided slice
    per slice): the function a pipeline runs per batch stays small, and so
    does its set-up per iterator (TF optimizes it at every `iter`).

    Args:
      batch: A nest of tensors (or None) with `rows` leading rows each.
      rows: The batch's row count (`batch_rows`).
      indices: Which slices to return, each in `[0, num_slices)`.
      num_slices: How many slices the batch is cut into.
    """
    sizes = slice_sizes(rows, num_slices)

    def cut(t: Any) -> list[Any]:
        if t is None or isinstance(t, tf.RaggedTensor):  # No ragged split: slice each.
            return [take_rows(t, *slice_bounds(rows, i, num_slices)) for i in indices]
        pieces = tf.split(t, sizes, num=num_slices, axis=0)
        return [pieces[i] for i in indices]

    columns = [cut(t) for t in tf.nest.flatten(batch)]
    return [
        tf.nest.pack_sequence_as(batch, [column[k] for column in columns])
        for k in range(len(indices))
    ]


def take_rows(batch: Nested, start: tf.Tensor, size: tf.Tensor) -> Nested:
    """Rows `[start, start + size)` of every component of `batch` (None stays None)."""
    return tf.nest.map_structure(
        lambda t: None if t is None else t[start : start + size], batch
    )
