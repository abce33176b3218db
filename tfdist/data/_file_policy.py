"""`shard`'s file policy: each pipeline reads whole files, dealt round robin per epoch.

Every pipeline must know every shard's size to agree on the step count, so
the records of every file are counted once, when `shard` is called (one
full read of all files on every worker, in parallel); records are then
permuted within windows of about `max_in_memory_bytes / 2`. Exactly-once
still holds; a global per-example permutation does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist.data import _checks
from tfdist.data import _element_policy
from tfdist.data import _pipeline
from tfdist.data import _plan
from tfdist.data import _source
from tfdist.data.policies import Remainder
from tfdist.data.policies import ShardPolicy

__all__ = ["read_files", "shard_files"]

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any


def _file_shards_are_even(
    counts: np.ndarray, layout: _plan.ReplicaLayout
) -> bool:
    """Whether every epoch's round-robin deal gives equal, full-step shards."""
    num_files = len(counts)
    return (
        num_files % layout.num_input_pipelines == 0
        and bool(np.all(counts == counts[0]))
        and (num_files // layout.num_input_pipelines * int(counts[0]))
        % layout.pipeline_batch_size
        == 0
    )


def read_files(
    files: tuple[str, ...],
    read: Callable[[tf.Tensor], tf.data.Dataset],
    parse_fn: Callable[..., Nested] | None,
) -> tf.data.Dataset:
    """All files, in the given order, as one dataset of parsed elements."""
    records = tf.data.Dataset.from_tensor_slices(list(files)).flat_map(read)
    if parse_fn is not None:
        records = records.map(parse_fn)
    return records


def shard_files(
    files: tuple[str, ...],
    layout: _plan.ReplicaLayout,
    schedule: _pipeline.EpochSchedule,
    policy: ShardPolicy,
    remainder: Remainder,
    *,
    read: Callable[[tf.Tensor], tf.data.Dataset],
    parse_fn: Callable[..., Nested] | None,
    max_in_memory_bytes: int,
) -> tf.data.Dataset:
    """File input: the file policy, or the element policy over all files."""
    num_pipelines = layout.num_input_pipelines
    records = read_files(files, read, parse_fn)  # Traces; reads nothing.
    _checks.check_dense_elements(records.element_spec)
    if remainder is Remainder.PAD:
        _checks.check_pad_structure(records.element_spec)
    if policy is ShardPolicy.AUTO and len(files) < num_pipelines:
        logging.info(
            "tfdist.data.shard: policy='auto' chose 'element': %d files are "
            "fewer than the %d input pipelines, so every pipeline reads all "
            "files and takes its share of examples.",
            len(files),
            num_pipelines,
        )
        policy = ShardPolicy.ELEMENT
    if policy is ShardPolicy.ELEMENT:
        return _element_policy.shard_elements(
            records,
            layout,
            schedule,
            remainder,
            max_in_memory_bytes,
        )[0]
    counts = _source.count_records(files, read)
    total = int(counts.sum())
    logging.info(
        "tfdist.data.shard: counted the records of %d files once (one full "
        "read of every file on every worker): %d records.",
        len(files),
        total,
    )
    if total == 0:
        raise errors.ConfigError(
            f"the {len(files)} input files hold no records; there is nothing "
            "to shard. Check the paths and the reader."
        )
    if remainder is Remainder.ERROR and not _file_shards_are_even(
        counts, layout
    ):
        if policy is ShardPolicy.FILE:
            raise errors.ConfigError(
                "remainder='error' with policy='file' needs equal, full-step "
                f"shards every epoch; received {len(files)} files with record "
                f"counts from {counts.min()} to {counts.max()} for "
                f"{num_pipelines} input pipelines of "
                f"{layout.pipeline_batch_size} examples per step. Use "
                "remainder='pad' or 'drop', or policy='element'."
            )
        logging.info(
            "tfdist.data.shard: policy='auto' chose 'element': "
            "remainder='error' needs equal shards and the files' record "
            "counts (%d to %d) do not split evenly over %d input pipelines.",
            counts.min(),
            counts.max(),
            num_pipelines,
        )
        return _element_policy.shard_elements(
            records,
            layout,
            schedule,
            remainder,
            max_in_memory_bytes,
        )[0]
    if policy is ShardPolicy.AUTO:
        logging.info(
            "tfdist.data.shard: policy='auto' chose 'file': %d files for %d "
            "input pipelines; each pipeline reads whole files.",
            len(files),
            num_pipelines,
        )
    drop_remainder = _element_policy.drop(remainder)
    if drop_remainder:
        smallest = _plan.min_round_robin_shard_size(counts, num_pipelines)
        if smallest < layout.pipeline_batch_size:
            raise errors.ConfigError(
                "remainder='drop' with policy='file' could drop a whole "
                f"epoch: a pipeline may get only {smallest} records (its "
                f"{len(files) // num_pipelines} smallest files), fewer than "
                f"one step of {layout.pipeline_batch_size}. Use "
                "remainder='pad', policy='element', or more data per file."
            )
    first = _source.first_element(records)
    first_plan = _pipeline.file_epoch_plan(
        schedule.first_epoch,
        record_counts=counts,
        layout=layout,
        seed=schedule.seed,
        shuffle=schedule.shuffle,
        drop_remainder=drop_remainder,
    )
    num_steps = int(first_plan.num_steps)
    used = num_steps * layout.global_batch_size
    logging.info(
        "tfdist.data.shard: file policy, epoch %d: %d global steps; %s %d of "
        "%d examples (varies by epoch with the file deal).",
        schedule.first_epoch,
        num_steps,
        "drops" if drop_remainder else "pads with",
        abs(total - used),
        total,
    )
    _checks.check_start_step(
        schedule.start_step, num_steps, schedule.first_epoch
    )
    bytes_per_element = max(
        1,
        sum(int(np.asarray(t).nbytes) for t in tf.nest.flatten(first)),
    )
    return _pipeline.file_shards(
        files,
        counts,
        reader=read,
        parse_fn=parse_fn,
        layout=layout,
        schedule=schedule,
        drop_remainder=drop_remainder,
        steps_per_window=_element_policy.steps_per_window(
            bytes_per_element, layout.pipeline_batch_size, max_in_memory_bytes
        ),
        zero_element=_source.zeros_like_element(first),
    )
