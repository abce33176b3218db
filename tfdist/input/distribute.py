"""`distribute_dataset`: what every tfdist strategy's `experimental_distribute_dataset` does.

    user's batched dataset
        -> one pipeline per worker (never a copy per replica)
        -> each global batch cut into this worker's replica slices
        -> a DistributedDataset of per-replica values, read on the host

Which batches a worker's pipeline yields (`source`):

- one worker, or a pipeline that gives the same batches on every worker
  (`determinism.nondeterministic_ops` finds nothing): the worker reads
  the user's dataset itself and keeps its slices of every global batch;
- otherwise (an unseeded shuffle, a generator, random ops...) the chief
  runs the one pipeline and each worker reads its slices of every global
  batch from it through the tf.data service (`data_service`).

With `tfdist.data.ShardOptions`, the dataset is instead unbatched and
sharded by `tfdist.data.shard` (deterministic from its seed, so every
worker computes its own share).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist._internal import input_values
from tfdist._internal import tf_data
from tfdist.data import options as options_lib
from tfdist.input import data_service
from tfdist.input import dataset as dataset_lib
from tfdist.input import determinism
from tfdist.input import elements
from tfdist.input import split

__all__ = ["distribute_dataset", "map_batches", "nominal_batch_size"]


def distribute_dataset(
    dataset: Any,
    layout: split.InputLayout,
    *,
    shard_options: options_lib.ShardOptions | None = None,
    input_options: tf.distribute.InputOptions | None = None,
    chief_service: data_service.ChiefInputService | None = None,
) -> tf.distribute.DistributedDataset:
    """Returns `dataset` distributed over the replicas of `layout`.

    Args:
      dataset: A batched `tf.data.Dataset` (or an already distributed one,
        returned as is).
      layout: This worker's replicas among all replicas in sync.
      shard_options: If set, shard with `tfdist.data.shard` (see module).
      input_options: TF's `tf.distribute.InputOptions`; every replica reads
        on the host, so only `experimental_replication_mode=PER_REPLICA` is
        checked (refused, as by TF for this method).
      chief_service: With several workers, what serves pipelines that
        would differ between workers; None for one worker.

    Raises:
      TypeError: If `dataset` is not a `tf.data.Dataset`.
      ConfigError: If its elements are not batches of dense or ragged
        tensors, or `input_options` asks for PER_REPLICA.
    """
    if isinstance(dataset, tf.distribute.DistributedDataset):
        return dataset
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            "experimental_distribute_dataset takes a tf.data.Dataset of "
            f"batches; received dataset={dataset!r} of type "
            f"{type(dataset).__name__}. Wrap arrays with "
            "tf.data.Dataset.from_tensor_slices(...).batch(global_batch_size)."
        )
    if (
        input_options is not None
        and input_options.experimental_replication_mode
        == tf.distribute.InputReplicationMode.PER_REPLICA
    ):
        raise errors.ConfigError(
            "InputReplicationMode.PER_REPLICA is not supported by "
            "experimental_distribute_dataset (as in TF); received "
            f"options={input_options!r}. Use "
            "strategy.distribute_datasets_from_function for per-replica "
            "pipelines, or drop the option."
        )
    split.check_batched_elements(dataset.element_spec, what="the dataset")
    nominal = nominal_batch_size(dataset)
    if shard_options is not None:
        return _sharded(dataset, layout, shard_options, nominal)
    if chief_service is not None and layout.num_workers > 1:
        reasons = determinism.nondeterministic_ops(dataset)
        if reasons:
            logging.info(
                "tfdist: the input pipeline may yield different batches on "
                "different workers (%s); the chief runs it and serves every "
                "worker its slices (tf.data service).",
                ", ".join(reasons),
            )
            return chief_service.distribute(dataset, nominal)
    per_replica = map_batches(
        dataset, lambda batch: split.split_batch(batch, layout, nominal)
    ).prefetch(tf.data.AUTOTUNE)
    return dataset_lib.DistributedDataset.from_dataset(per_replica)


def _sharded(
    dataset: tf.data.Dataset,
    layout: split.InputLayout,
    shard_options: options_lib.ShardOptions,
    nominal: int | None,
) -> tf.distribute.DistributedDataset:
    """Unbatches `dataset` and shards it with `shard_options`, a step at a time."""
    global_batch_size = nominal or 1
    steps = shard_options.shard_steps(
        dataset.unbatch(),
        tf.distribute.InputContext(
            num_input_pipelines=layout.num_workers,
            input_pipeline_id=layout.worker_index,
            num_replicas_in_sync=layout.num_replicas_in_sync,
        ),
        global_batch_size=global_batch_size,
    )

    @tf.autograph.experimental.do_not_convert
    def per_replica(batches: Any, is_real: tf.Tensor, num_real: tf.Tensor) -> Any:
        replicas = [
            tf.nest.map_structure(lambda t, r=r: tf.boolean_mask(t[r], is_real[r]), batches)
            for r in range(layout.num_local_replicas)
        ]
        return tf.nest.map_structure(
            lambda *leaves: input_values.InputPerReplica(
                leaves, num_real[0], nominal
            ),
            *replicas,
        )

    return dataset_lib.DistributedDataset.from_dataset(
        steps.map(per_replica).prefetch(tf.data.AUTOTUNE)
    )


def map_batches(dataset: tf.data.Dataset, fn: Any) -> tf.data.Dataset:
    """`dataset.map(fn)`, with `fn` taking each whole element."""
    return dataset.map(elements.whole_element(dataset.element_spec, fn))


def nominal_batch_size(dataset: tf.data.Dataset) -> int | None:
    """The global batch size `dataset` was batched with, if it can be known.

    The static batch dimension when there is one; otherwise (a partial last
    batch makes it unknown) the size its `batch` op was given, read from the
    pipeline's graph. None when neither says (e.g. Keras's own numpy
    pipeline, which slices index batches); the data is never read, so a
    reshuffling pipeline is not advanced.
    """
    first_leaf = tf.nest.flatten(dataset.element_spec)[0]
    static = first_leaf.shape[0] if first_leaf.shape.rank else None
    if static is not None:
        return int(static)
    return tf_data.batch_size(dataset)
