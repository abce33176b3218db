"""`distribute_dataset`: what every tfdist strategy's `experimental_distribute_dataset` does.

    user's batched dataset
        -> one pipeline per worker (never a copy per replica)
        -> each global batch cut into this worker's replica slices
        -> a DistributedDataset of per-replica values, read on the host

Which batches a worker's pipeline yields:

- one worker, or a pipeline that gives the same batches on every worker
  (`determinism.find_nondeterminism` finds nothing): the worker reads
  the user's dataset itself and keeps its slices of every global batch;
- a pipeline whose only difference between copies is unseeded shuffles
  (the commonest: `shuffle(n)` with no seed): the same, on a copy whose
  shuffles use a seed all workers agree on (`determinism.seed_shuffles`);
- otherwise (a generator, `py_function`, random ops in `map`, Keras's own
  shuffling of numpy inputs...) the chief runs the one pipeline and each
  worker reads its slices of every global batch from it through the
  tf.data service (`data_service`).

`agreeing_dataset_fn` does the same for a user's `dataset_fn` (which
shards by worker itself): shuffles before the shard get agreed seeds, and
other differences before it are refused.

With `tfdist.data.ShardOptions`, the dataset is instead unbatched and
sharded by `tfdist.data.shard` (deterministic from its seed, so every
worker computes its own share).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist._internal import input_values
from tfdist._internal import tf_data
from tfdist._internal import tf_random
from tfdist.data import _pipeline
from tfdist.data import options as options_lib
from tfdist.data.distributed import data_service
from tfdist.data.distributed import dataset as dataset_lib
from tfdist.data.distributed import determinism
from tfdist.data.distributed import elements
from tfdist.data.distributed import split

__all__ = [
    "agreeing_dataset_fn",
    "distribute_dataset",
    "map_batches",
    "nominal_batch_size",
]


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
    if chief_service is not None and layout.num_workers > 1:
        graph = tf_data.pipeline_graph(dataset)
        findings = determinism.find_nondeterminism(graph)
        if findings and all(f.fixable for f in findings):
            dataset = determinism.seed_shuffles(dataset, graph, chief_service.agreed_seed())
        elif findings and shard_options is not None:
            # Every worker reads its own copy to shard it: copies that
            # differ would not partition the data.
            raise errors.ConfigError(
                "shard_options needs an input pipeline that yields the same "
                "elements on every worker; received a dataset with "
                f"{', '.join(sorted({str(f) for f in findings}))}. Seed its "
                "random operations (or move them after the strategy's "
                "shuffle), or drop shard_options and let the chief serve "
                "the pipeline."
            )
        elif findings:
            logging.info(
                "tfdist: the input pipeline may yield different batches on "
                "different workers (%s); the chief runs it and serves every "
                "worker its slices (tf.data service).",
                ", ".join(sorted({str(f) for f in findings})),
            )
            return chief_service.distribute(dataset, nominal)
    if shard_options is not None:
        return _sharded(dataset, layout, shard_options, nominal)
    per_replica = map_batches(
        dataset, lambda batch: split.split_batch(batch, layout, nominal)
    ).prefetch(tf.data.AUTOTUNE)
    return dataset_lib.DistributedDataset.from_dataset(per_replica)


def agreeing_dataset_fn(
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    chief_service: data_service.ChiefInputService,
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """`dataset_fn` whose pipelines agree across workers up to their shards.

    A `dataset_fn` commonly shuffles and then takes this worker's shard
    (`Dataset.shard(num_input_pipelines, input_pipeline_id)`): the shards
    partition the data only if every worker's copy has the same order
    before the shard. The returned function builds the pipeline under an
    agreed global seed (`tf_random.global_seed`), so the shuffles and
    random ops it creates without a seed get the same seeds on every
    worker and still reshuffle every epoch; unseeded shuffles built outside
    `dataset_fn` are given agreed seeds (`determinism.seed_shuffles`: the
    same order every epoch); and other differences that feed a shard are
    refused.

    Raises (when the returned function is called):
      ConfigError: If a generator, `py_function`, unseeded random op or
        non-deterministic order feeds a `Dataset.shard`.
    """
    seed = chief_service.agreed_seed()

    def agreeing(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        with tf_random.global_seed(seed):
            dataset = dataset_fn(input_context)
        if not isinstance(dataset, tf.data.Dataset):
            return dataset  # TF's own checks report it.
        graph = tf_data.pipeline_graph(dataset)
        findings = determinism.find_nondeterminism(graph)
        if not findings:
            return dataset
        nodes, functions = determinism.upstream_of(graph, _SHARD_OPS)
        unfixable = [
            f
            for f in findings
            if not f.fixable and (f.node in nodes or f.function in functions)
        ]
        if unfixable:
            raise errors.ConfigError(
                "the dataset_fn's pipeline shards (Dataset.shard) data whose "
                "order differs between workers: "
                f"{', '.join(sorted({str(f) for f in unfixable}))} before the "
                "shard, so the workers' shards overlap and some examples would "
                "be lost or repeated each epoch. Shard first and do the "
                "random or Python steps after it, seed them (e.g. "
                "tf.random.set_seed at the start of the script), or use "
                "tfdist.data.shard(dataset, input_context, ...)."
            )
        if any(f.fixable for f in findings):
            return determinism.seed_shuffles(dataset, graph, seed)
        return dataset

    return agreeing


#: Ops that take one worker's part of a pipeline.
_SHARD_OPS = ("ShardDataset",)


def _sharded(
    dataset: tf.data.Dataset,
    layout: split.InputLayout,
    shard_options: options_lib.ShardOptions,
    nominal: int | None,
) -> tf.distribute.DistributedDataset:
    """Unbatches `dataset` and shards it with `shard_options`, a step at a time."""
    global_batch_size = nominal or 1
    context = tf.distribute.InputContext(
        num_input_pipelines=layout.num_workers,
        input_pipeline_id=layout.worker_index,
        num_replicas_in_sync=layout.num_replicas_in_sync,
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

    def per_replica_steps(options: options_lib.ShardOptions) -> dataset_lib.DistributedDataset:
        with _pipeline.iteration_counters() as counters:
            steps = options.shard_steps(
                dataset.unbatch(), context, global_batch_size=global_batch_size
            )
        per_step = steps.map(per_replica).prefetch(tf.data.AUTOTUNE)
        first_epoch = options.epoch or 0
        (counter,) = counters

        def pass_epoch() -> int:
            # The sharder numbers only iterators that produced (Keras 3
            # makes some it never reads).
            return first_epoch + max(int(counter.numpy()) - 1, 0)

        return dataset_lib.DistributedDataset(
            lambda: per_step,
            element_spec=per_step.element_spec,
            cardinality=int(per_step.cardinality()),
            # A new sharder whose passes are epoch e from step k, then e + 1...
            resumed=lambda point: per_replica_steps(
                dataclasses.replace(options, epoch=point.epoch, start_step=point.step)
            ),
            pass_epoch=pass_epoch,
        )

    return per_replica_steps(shard_options)


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
