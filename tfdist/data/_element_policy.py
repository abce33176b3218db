"""`shard`'s element policy: one global permutation, each pipeline its replicas' slots.

A finite dataset whose estimated size is at most `max_in_memory_bytes` is
read once into host memory (`dataset.batch(N).get_single_element()` plus one
zero row); each epoch then costs one vectorized stateless permutation of
this pipeline's positions and one `tf.gather` per per-replica batch: no
shuffle buffer. A larger dataset is streamed in windows of about
`max_in_memory_bytes / 2` (a whole number of global steps) and permuted
within each window; every pipeline then reads the whole dataset each epoch.
"""

from __future__ import annotations

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist.data import _checks
from tfdist.data import _pipeline
from tfdist.data import _plan
from tfdist.data import _source
from tfdist.data.policies import Remainder

__all__ = ["drop", "shard_elements", "steps_per_window"]


def drop(remainder: Remainder) -> bool:
    return remainder is Remainder.DROP


def steps_per_window(
    bytes_per_element: int, per_step: int, max_in_memory_bytes: int
) -> int:
    return max(1, (max_in_memory_bytes // 2) // (bytes_per_element * per_step))


def shard_elements(
    dataset: tf.data.Dataset,
    layout: _plan.ReplicaLayout,
    schedule: _pipeline.EpochSchedule,
    remainder: Remainder,
    max_in_memory_bytes: int,
) -> tuple[tf.data.Dataset, int | None]:
    """Element policy: one global permutation, each pipeline its replicas.

    Returns the per-replica batches and the number of global steps of every
    iteration (None when iterations differ: resumption mid-epoch).
    """
    _checks.check_dense_elements(dataset.element_spec)
    if remainder is Remainder.PAD:
        _checks.check_pad_structure(dataset.element_spec)
    num_elements, was_counted = _source.count_elements(dataset)
    if was_counted:
        logging.info(
            "tfdist.data.shard: dataset cardinality is unknown; counted "
            "%d elements in one full pass over the input.",
            num_elements,
        )
    if num_elements == 0:
        raise errors.ConfigError(
            "dataset is empty (0 elements); there is nothing to shard. Check "
            "the input files or filters."
        )
    batch_size = layout.global_batch_size
    tail = num_elements % batch_size
    if remainder is Remainder.ERROR and tail:
        raise errors.ConfigError(
            f"dataset size {num_elements} is not divisible by "
            f"global_batch_size={batch_size} ({tail} examples left over) and "
            "remainder='error'. Use remainder='pad' (masked padding, every "
            "example seen) or remainder='drop' (drops the remainder), or a "
            "global_batch_size that divides the dataset size."
        )
    if remainder is Remainder.DROP and num_elements < batch_size:
        raise errors.ConfigError(
            f"dataset size {num_elements} is smaller than "
            f"global_batch_size={batch_size}, so remainder='drop' leaves no "
            "step at all. Use remainder='pad' or a smaller global_batch_size."
        )
    num_steps = _plan.steps_per_epoch(
        num_elements, batch_size, drop_remainder=drop(remainder)
    )
    if remainder is Remainder.DROP and tail:
        logging.info(
            "tfdist.data.shard: remainder='drop' drops %d of %d examples per "
            "epoch (global_batch_size=%d); a different random subset each "
            "epoch when shuffling.",
            tail,
            num_elements,
            batch_size,
        )
    _checks.check_start_step(
        schedule.start_step, num_steps, schedule.first_epoch
    )
    bytes_per_element = _source.element_bytes(dataset, num_elements)
    dataset_bytes = bytes_per_element * num_elements
    if dataset_bytes <= max_in_memory_bytes:
        logging.info(
            "tfdist.data.shard: element policy, holding the dataset in memory "
            "(%d elements, about %d bytes <= max_in_memory_bytes=%d).",
            num_elements,
            dataset_bytes,
            max_in_memory_bytes,
        )
        batches = _pipeline.element_in_memory(
            _source.materialize(dataset, num_elements),
            num_elements=num_elements,
            num_steps=num_steps,
            layout=layout,
            schedule=schedule,
        )
    else:
        window_steps = steps_per_window(
            bytes_per_element, batch_size, max_in_memory_bytes
        )
        logging.info(
            "tfdist.data.shard: element policy, streaming the dataset (about "
            "%d bytes > max_in_memory_bytes=%d) in windows of %d elements, "
            "permuted within each window; every pipeline reads all of it.",
            dataset_bytes,
            max_in_memory_bytes,
            window_steps * batch_size,
        )
        batches = _pipeline.element_streaming(
            dataset,
            num_elements=num_elements,
            num_steps=num_steps,
            layout=layout,
            schedule=schedule,
            steps_per_window=window_steps,
            zero_element=_source.zeros_like_element(
                _source.first_element(dataset)
            ),
        )
    # A known cardinality lets Keras size its epochs. Only declared when it is
    # the number of global steps: TF's DistributedDatasetsFromFunction
    # reports the per-worker dataset's element count as its number of steps
    # (TF 2.21 input_lib `_cardinality`), which is R times too many with R
    # local replicas; Keras then warns that the input ran out of data.
    steps = (
        num_steps - schedule.start_step
        if schedule.start_step == 0 or not schedule.reshuffle_each_iteration
        else None
    )
    if layout.num_local_replicas == 1 and steps is not None:
        batches = batches.apply(tf.data.experimental.assert_cardinality(steps))
    return batches, steps
