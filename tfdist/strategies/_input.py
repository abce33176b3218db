"""The input path of tfdist strategies: plain datasets, sharded by tfdist.

`experimental_distribute_dataset` of every tfdist strategy comes here. The
dataset is never given to TF's auto-sharding (so its "failed to apply FILE
sharding policy" warning cannot appear) or to TF's rebatching (which splits
a last partial batch unevenly and lets Keras average unequal means):

- `shard_options=None`: `tfdist.data.split_batches` cuts each global batch
  over all replicas of all workers, with loss weights that make an uneven
  batch train exactly like one device (see `tfdist/data/splitting.py`);
- a `tfdist.data.ShardOptions`: the dataset is unbatched and sharded with
  `tfdist.data.shard` at its own global batch size.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist._internal import tf_private
from tfdist._internal import validation
from tfdist.data import options as options_lib
from tfdist.data import splitting

__all__ = ["check_global_batch_divides", "check_shard_options", "distribute_dataset"]


def check_shard_options(value: object) -> options_lib.ShardOptions | None:
    """Returns `value` if it is a `ShardOptions` or None; else TypeError."""
    if value is not None and not isinstance(value, options_lib.ShardOptions):
        raise TypeError(
            "shard_options must be a tfdist.data.ShardOptions or None; "
            f"received shard_options={value!r} of type {type(value).__name__}."
        )
    return value


def distribute_dataset(
    strategy: tf.distribute.Strategy,
    dataset: tf.data.Dataset,
    shard_options: options_lib.ShardOptions | None,
    input_options: Any,
    *,
    read_on_host: bool = False,
) -> Any:
    """Returns `strategy`'s distributed dataset for the batched `dataset`.

    With `read_on_host` (replicas on host-memory devices: logical CPUs of
    one process, or a CPU worker with one replica) and no `input_options`
    of the caller's, every replica gets its own input pipeline that stays on
    the host, read by a plain iterator. TF's default prefetches each batch
    to each device through a `MultiDeviceIterator`, which on host memory
    only adds a function call per replica and step, and whose per-device
    GeneratorDatasets make TensorFlow set glibc's M_TRIM_THRESHOLD for the
    whole process (after which large tensors are page-faulted in anew at
    every allocation; see benchmarks/RESULTS.md).

    Raises:
      ConfigError: If the global batch size does not divide by
        `num_replicas_in_sync`, or the elements are not dense batches.
    """
    if isinstance(dataset, tf.distribute.DistributedDataset):
        return dataset
    batch_size = check_global_batch_divides(dataset, strategy.num_replicas_in_sync)
    if shard_options is None:
        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return splitting.split_batches(dataset, context)
    else:
        unbatched = dataset.unbatch()
        global_batch_size = batch_size or 1

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return shard_options.shard(
                unbatched, context, global_batch_size=global_batch_size
            )

    if input_options is None and read_on_host:
        return tf_private.distribute_datasets_read_on_host(strategy, dataset_fn)
    return strategy.distribute_datasets_from_function(dataset_fn, input_options)


def check_global_batch_divides(
    dataset: tf.data.Dataset, num_replicas_in_sync: int
) -> int | None:
    """Returns the global batch size, or None if the dataset is empty.

    The static batch dimension is used when known; otherwise (a final
    partial batch makes it unknown) the first batch is read once.

    Raises:
      ConfigError: If the batch size leaves replicas unequal.
    """
    batch_size = _global_batch_size(dataset)
    if batch_size is not None and num_replicas_in_sync > 1:
        validation.check_batch_divides(
            "global batch_size", batch_size, num_replicas_in_sync
        )
    return batch_size


def _global_batch_size(dataset: tf.data.Dataset) -> int | None:
    leaves = tf.nest.flatten(dataset.element_spec)
    shapes = [leaf.shape for leaf in leaves if isinstance(leaf, tf.TensorSpec)]
    if not shapes or shapes[0].rank in (None, 0):
        return None
    static = shapes[0][0]
    if static is not None:
        return int(static)
    first = next(iter(dataset.take(1)), None)
    if first is None:
        return None
    return int(tf.nest.flatten(first)[0].shape[0])
