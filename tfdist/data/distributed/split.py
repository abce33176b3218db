"""Cuts a global batch into this worker's per-replica slices.

G replicas in sync over W workers, R = G / W local replicas each; worker w
gives its local replica r the slice s = r * W + w of every global batch of
m rows (`tfdist.data.splitting.slice_bounds`: contiguous slices of
m // G or m // G + 1 rows, in order). Keras concatenates `predict` outputs
across workers as local replica 0 of every worker, then local replica 1,
and so on, which is slice order: `predict` returns rows in input order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist._internal import input_values
from tfdist.data import splitting

__all__ = ["InputLayout", "check_batched_elements", "split_batch"]

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any


@dataclasses.dataclass(frozen=True)
class InputLayout:
    """Where this worker's replicas sit among all replicas in sync.

    Attributes:
      num_replicas_in_sync: G, over all workers.
      num_workers: W, workers with one input pipeline each.
      worker_index: w, this worker's index in 0..W-1 (chief first).
    """

    num_replicas_in_sync: int
    num_workers: int
    worker_index: int

    @property
    def num_local_replicas(self) -> int:
        return self.num_replicas_in_sync // self.num_workers

    def slice_index(self, local_replica: int) -> int:
        """The slice of each global batch that `local_replica` gets."""
        return local_replica * self.num_workers + self.worker_index


def check_batched_elements(element_spec: Nested, *, what: str) -> None:
    """Raises ConfigError unless every component is a batched dense or ragged tensor.

    Args:
      element_spec: The dataset's `element_spec`.
      what: How to name the dataset in the message.
    """
    for spec in tf.nest.flatten(element_spec):
        if isinstance(spec, tf.SparseTensorSpec):
            raise errors.ConfigError(
                f"{what} has a tf.SparseTensor component ({spec!r}); tfdist "
                "splits batches by rows and supports dense and ragged "
                "tensors. Convert it with tf.sparse.to_dense (or to a "
                "tf.RaggedTensor) in the input pipeline."
            )
        if not isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec)):
            raise errors.ConfigError(
                f"{what} has a component of type spec {spec!r}; tfdist "
                "splits batches of dense or ragged tensors only. Return "
                "tensors from the input pipeline."
            )
        if spec.shape.rank == 0:
            raise errors.ConfigError(
                f"{what} yields a scalar component ({spec!r}), not a batch: "
                "a strategy splits each element's leading (batch) dimension "
                "over replicas. Call dataset.batch(global_batch_size) first."
            )


def split_batch(
    batch: Nested, layout: InputLayout, nominal_batch_size: int | None
) -> Nested:
    """Returns `batch` with every leaf an `InputPerReplica` of local slices.

    Args:
      batch: One global batch: a nest of tensors with one leading row count.
      layout: This worker's place among the replicas.
      nominal_batch_size: The input's global batch size, if known (kept in
        the values' type spec for the training check).
    """
    rows = splitting.batch_rows([t for t in tf.nest.flatten(batch) if t is not None])
    parts = splitting.take_slices(
        batch,
        rows,
        [layout.slice_index(r) for r in range(layout.num_local_replicas)],
        layout.num_replicas_in_sync,
    )
    return tf.nest.map_structure(
        lambda *leaves: None
        if leaves[0] is None
        else input_values.InputPerReplica(leaves, rows, nominal_batch_size),
        *parts,
    )
