"""tf.data graphs of the sharder: per-replica batches plus a real-slot mask.

Every builder returns a dataset of `(batch, is_real, num_real_in_step)`
triples: `batch` is the element structure with a leading per-replica batch
dimension `b`, `is_real` is a bool `[b]` (False for padding slots, whose
values are zeros), and `num_real_in_step` is an int64 scalar, the real
examples of this global step over all replicas and input pipelines (taken
from the plan, `_plan.real_elements_per_step`, since no pipeline sees the
others' batches). One element per replica per step, replicas of a step
consecutive.

The epoch number is a runtime value: an iteration dataset yields one scalar
per iterator (0 for the first iterator over the returned dataset, then 1,
...; it reads and increments a host-local variable), and `flat_map` builds
that iteration's epoch from it. Index math is `_plan` evaluated on int64
tensors through `TF_INT64`; permutations are `_permutation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist._internal import variables
from tfdist.data import _permutation
from tfdist.data import _plan

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any

# Functions handed to tf.data here have no Python control flow on tensors;
# skipping AutoGraph's conversion makes building a pipeline several times
# faster.
_no_autograph = tf.autograph.experimental.do_not_convert

#: Files each file-policy pipeline reads at once (interleave cycle length).
#: Fixed, not AUTOTUNE: the record order, and so resumption, must not depend
#: on the machine's core count.
FILE_CYCLE_LENGTH = 4


def _int64(value: Any) -> tf.Tensor:
    return tf.cast(value, tf.int64)


class _TfInt64Namespace:
    """`_plan.ArrayNamespace` on int64 TF tensors, usable in graph mode.

    `tf.experimental.numpy` is not: its `arange` branches on tensor values in
    Python. Every result is int64, as `_plan` expects of numpy.
    """

    int64 = tf.int64

    def where(self, condition: Any, x: Any, y: Any) -> tf.Tensor:
        return tf.where(condition, _int64(x), _int64(y))

    def minimum(self, x: Any, y: Any) -> tf.Tensor:
        return tf.minimum(_int64(x), _int64(y))

    def maximum(self, x: Any, y: Any) -> tf.Tensor:
        return tf.maximum(_int64(x), _int64(y))

    def arange(self, start: Any, stop: Any, *, dtype: Any) -> tf.Tensor:
        return tf.range(_int64(start), _int64(stop), dtype=dtype)

    def concatenate(self, arrays: list[Any]) -> tf.Tensor:
        return tf.concat([_int64(a) for a in arrays], axis=0)

    def zeros(self, shape: list[int], dtype: Any) -> tf.Tensor:
        return tf.zeros(shape, dtype)

    def asarray(self, array: Any, dtype: Any) -> tf.Tensor:
        return tf.cast(array, dtype)

    def reshape(self, array: Any, shape: list[int]) -> tf.Tensor:
        return tf.reshape(array, shape)

    def sum(self, array: Any, axis: int) -> tf.Tensor:
        return tf.reduce_sum(array, axis=axis)

    def min(self, array: Any) -> tf.Tensor:
        return tf.reduce_min(array)

    def max(self, array: Any) -> tf.Tensor:
        return tf.reduce_max(array)


#: `_plan`'s array namespace for int64 tensors.
TF_INT64 = _TfInt64Namespace()


@dataclasses.dataclass(frozen=True)
class EpochSchedule:
    """How iterations over the returned dataset map to epochs.

    Attributes:
      seed: The user's seed.
      shuffle: Whether to permute at all.
      first_epoch: Epoch of the first iteration.
      start_step: Global step the first iteration starts at.
      reshuffle_each_iteration: If true, iteration i is epoch
        first_epoch + i (from step 0 for i > 0); else every iteration replays
        (first_epoch, start_step).
    """

    seed: int
    shuffle: bool
    first_epoch: int
    start_step: int
    reshuffle_each_iteration: bool


#: Lists collecting the iteration counters made while `iteration_counters` is open.
_collecting: list[list[tf.Variable]] = []


@contextlib.contextmanager
def iteration_counters() -> Iterator[list[tf.Variable]]:
    """Collects the counters of the pipelines built inside (see `iterations`).

    A counter's value is the number of iterators that have started
    producing; the epoch of the last of them is `first_epoch + value - 1`.
    """
    counters: list[tf.Variable] = []
    _collecting.append(counters)
    try:
        yield counters
    finally:
        _collecting.remove(counters)


def iterations(schedule: EpochSchedule) -> tf.data.Dataset:
    """One int64 scalar per iterator: the iteration number (see module doc)."""
    zero = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64))
    if not schedule.reshuffle_each_iteration:
        return zero
    counter = variables.make_local_counter("tfdist_data_iteration")
    for counters in _collecting:
        counters.append(counter)

    @_no_autograph
    def next_iteration(unused: tf.Tensor) -> tf.Tensor:
        del unused
        return counter.assign_add(1) - 1

    return zero.map(next_iteration)


def _epoch_and_first_step(
    schedule: EpochSchedule, iteration: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    epoch = schedule.first_epoch + iteration
    first_step = tf.where(
        iteration == 0,
        tf.constant(schedule.start_step, tf.int64),
        tf.constant(0, tf.int64),
    )
    return epoch, first_step


def _gather(data: Nested, rows: tf.Tensor) -> Nested:
    return tf.nest.map_structure(lambda t: tf.gather(t, rows), data)


def _real_counts(
    first_step: Any,
    end_step: Any,
    *,
    group_sizes: Any,
    per_step: int,
    num_local_replicas: int,
) -> tf.Tensor:
    """int64 `[(end - first) * R]`: each batch's `num_real_in_step`.

    One value per per-replica batch of steps `first_step .. end_step - 1`
    (each step's value repeated for its R local replicas); see
    `_plan.real_elements_per_step` for `group_sizes` and `per_step`.
    """
    steps = tf.range(_int64(first_step), _int64(end_step), dtype=tf.int64)
    counts = _plan.real_elements_per_step(
        steps, group_sizes=group_sizes, per_step=per_step, xp=TF_INT64
    )
    return tf.repeat(counts, num_local_replicas)


def element_in_memory(
    data: Nested,
    *,
    num_elements: int,
    num_steps: int,
    layout: _plan.ReplicaLayout,
    schedule: EpochSchedule,
) -> tf.data.Dataset:
    """Element policy over a materialized dataset (one window: all of it).

    Args:
      data: Structure of tensors `[num_elements + 1, ...]` (last row zeros),
        from `_source.materialize`.
      num_elements: Elements in the dataset.
      num_steps: Global steps per epoch.
      layout: This pipeline's replicas.
      schedule: Epochs and seed.

    Returns:
      A dataset of `(batch, is_real, num_real_in_step)`.
    """
    batch = layout.per_replica_batch_size

    @_no_autograph
    def rows_of_iteration(iteration: tf.Tensor) -> tf.data.Dataset:
        epoch, first_step = _epoch_and_first_step(schedule, iteration)
        positions = _plan.pipeline_positions(
            num_elements=num_elements,
            num_steps=num_steps,
            num_replicas=layout.num_replicas_in_sync,
            first_replica=layout.first_replica,
            num_local_replicas=layout.num_local_replicas,
            per_replica_batch_size=batch,
            first_step=first_step,
            xp=TF_INT64,
        )
        seed = _permutation.sub_seed(
            _permutation.epoch_seed(schedule.seed, epoch),
            _permutation.ELEMENT_SCOPE,
            0,
        )
        rows = _permutation.window_rows(
            positions,
            window_start=0,
            window_size=num_elements,
            seed=seed,
            shuffle=schedule.shuffle,
        )
        counts = _real_counts(
            first_step,
            num_steps,
            group_sizes=[num_elements],
            per_step=layout.global_batch_size,
            num_local_replicas=layout.num_local_replicas,
        )
        return tf.data.Dataset.from_tensor_slices(
            (tf.reshape(rows, [-1, batch]), counts)
        )

    return (
        iterations(schedule)
        .flat_map(rows_of_iteration)
        .map(
            _no_autograph(
                lambda rows, count: (
                    _gather(data, rows),
                    rows < num_elements,
                    count,
                )
            ),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    )


@dataclasses.dataclass(frozen=True)
class _Stream:
    """A stream of positions cut into windows of `steps_per_window` steps."""

    num_elements: Any  # int or int64 scalar tensor (runtime epoch).
    data_steps: Any  # Steps that hold data; int or int64 scalar tensor.
    num_replicas: int  # Replicas in the group sharing each step.
    first_replica: int  # This pipeline's first replica in the group.
    num_local_replicas: int
    per_replica_batch_size: int
    steps_per_window: int
    seed: tf.Tensor  # The epoch's seed, folded with the scope.
    # int64 [num_groups]: positions of every group of replicas that shares
    # a global step, this stream's among them (element policy: just
    # [num_elements]; file policy: every pipeline's shard size).
    group_sizes: Any

    @property
    def per_step(self) -> int:
        return self.num_replicas * self.per_replica_batch_size

    @property
    def window_size(self) -> int:
        return self.steps_per_window * self.per_step


def _windowed_batches(
    elements: tf.data.Dataset,
    stream: _Stream,
    *,
    first_step: tf.Tensor,
    shuffle: bool,
    zero_element: Nested,
) -> tf.data.Dataset:
    """Reads `elements` a window at a time; yields this pipeline's batches."""
    steps = stream.steps_per_window
    batch = stream.per_replica_batch_size
    first_window = first_step // steps
    end_window = -(-tf.cast(stream.data_steps, tf.int64) // steps)
    num_windows = tf.maximum(end_window - first_window, 0)
    windows = (
        elements.skip(first_window * stream.window_size)
        .batch(stream.window_size)
        .take(num_windows)
    )
    indices = tf.data.Dataset.range(first_window, end_window)

    @_no_autograph
    def batches_of_window(
        window_index: tf.Tensor, window: Nested
    ) -> tf.data.Dataset:
        rows_in_window = tf.shape(tf.nest.flatten(window)[0], tf.int64)[0]
        window_first_step = tf.maximum(window_index * steps, first_step)
        window_end_step = tf.minimum(
            (window_index + 1) * steps, stream.data_steps
        )
        positions = _plan.pipeline_positions(
            num_elements=stream.num_elements,
            num_steps=window_end_step,
            num_replicas=stream.num_replicas,
            first_replica=stream.first_replica,
            num_local_replicas=stream.num_local_replicas,
            per_replica_batch_size=batch,
            first_step=window_first_step,
            xp=TF_INT64,
        )
        counts = _real_counts(
            window_first_step,
            window_end_step,
            group_sizes=stream.group_sizes,
            per_step=stream.per_step,
            num_local_replicas=stream.num_local_replicas,
        )
        rows = _permutation.window_rows(
            positions,
            window_start=window_index * stream.window_size,
            window_size=rows_in_window,
            seed=_permutation.sub_seed(stream.seed, window_index),
            shuffle=shuffle,
        )
        padded = tf.nest.map_structure(
            lambda t, z: tf.concat([t, z[tf.newaxis]], axis=0),
            window,
            zero_element,
        )
        return tf.data.Dataset.from_tensor_slices(
            (tf.reshape(rows, [-1, batch]), counts)
        ).map(
            _no_autograph(
                lambda r, count: (
                    _gather(padded, r),
                    r < rows_in_window,
                    count,
                )
            )
        )

    return tf.data.Dataset.zip(indices, windows).flat_map(batches_of_window)


def element_streaming(
    dataset: tf.data.Dataset,
    *,
    num_elements: int,
    num_steps: int,
    layout: _plan.ReplicaLayout,
    schedule: EpochSchedule,
    steps_per_window: int,
    zero_element: Nested,
) -> tf.data.Dataset:
    """Element policy over a dataset too big to hold: permuted per window.

    Every pipeline reads the whole dataset, a window of
    `steps_per_window * global_batch_size` elements at a time, and keeps its
    replicas' slots of each window's permutation.

    Returns:
      A dataset of `(batch, is_real, num_real_in_step)`.
    """

    @_no_autograph
    def batches_of_iteration(iteration: tf.Tensor) -> tf.data.Dataset:
        epoch, first_step = _epoch_and_first_step(schedule, iteration)
        stream = _Stream(
            num_elements=num_elements,
            data_steps=num_steps,
            num_replicas=layout.num_replicas_in_sync,
            first_replica=layout.first_replica,
            num_local_replicas=layout.num_local_replicas,
            per_replica_batch_size=layout.per_replica_batch_size,
            steps_per_window=steps_per_window,
            seed=_permutation.sub_seed(
                _permutation.epoch_seed(schedule.seed, epoch),
                _permutation.ELEMENT_SCOPE,
            ),
            group_sizes=[num_elements],
        )
        return _windowed_batches(
            dataset,
            stream,
            first_step=first_step,
            shuffle=schedule.shuffle,
            zero_element=zero_element,
        )

    return iterations(schedule).flat_map(batches_of_iteration)


@dataclasses.dataclass(frozen=True)
class FileEpochPlan:
    """One epoch of the file policy, for every pipeline (eager or symbolic).

    Attributes:
      file_order: int64 `[num_files]`, the epoch's file order; pipeline q
        reads `file_order[q::num_input_pipelines]`.
      shard_sizes: int64 `[num_input_pipelines]`, records per pipeline.
      num_steps: int64 scalar, global steps of the epoch (same everywhere).
    """

    file_order: Any  # int64 tensor.
    shard_sizes: Any  # int64 tensor.
    num_steps: Any  # int64 scalar tensor.


def file_epoch_plan(
    epoch: tf.Tensor | int,
    *,
    record_counts: np.ndarray,
    layout: _plan.ReplicaLayout,
    seed: int,
    shuffle: bool,
    drop_remainder: bool,
) -> FileEpochPlan:
    """Deals the epoch's permuted files to pipelines; sizes and step count."""
    order = _permutation.file_order(
        len(record_counts),
        _permutation.epoch_seed(seed, epoch),
        shuffle=shuffle,
    )
    sizes = _plan.round_robin_shard_sizes(
        tf.gather(tf.constant(record_counts, tf.int64), order),
        layout.num_input_pipelines,
        xp=TF_INT64,
    )
    steps = _plan.shard_steps(
        sizes,
        layout.pipeline_batch_size,
        drop_remainder=drop_remainder,
        xp=TF_INT64,
    )
    return FileEpochPlan(file_order=order, shard_sizes=sizes, num_steps=steps)


def file_shards(
    files: Sequence[str],
    record_counts: np.ndarray,
    *,
    reader: Callable[[tf.Tensor], tf.data.Dataset],
    parse_fn: Callable[..., Nested] | None,
    layout: _plan.ReplicaLayout,
    schedule: EpochSchedule,
    drop_remainder: bool,
    steps_per_window: int,
    zero_element: Nested,
) -> tf.data.Dataset:
    """File policy: this pipeline reads whole files, dealt round robin.

    Per epoch: permute the files, deal them to pipelines round robin,
    interleave this pipeline's files, permute its records within windows,
    batch for its local replicas, then pad (or cut) to the step count every
    pipeline agrees on.

    Returns:
      A dataset of `(batch, is_real, num_real_in_step)`.
    """
    pipeline = layout.input_pipeline_id
    per_step = layout.pipeline_batch_size
    batch = layout.per_replica_batch_size
    paths = tf.constant(list(files), tf.string)
    zero_batch = tf.nest.map_structure(
        lambda z: tf.repeat(z[tf.newaxis], batch, axis=0), zero_element
    )
    no_real = tf.zeros([batch], tf.bool)

    @_no_autograph
    def batches_of_iteration(iteration: tf.Tensor) -> tf.data.Dataset:
        epoch, first_step = _epoch_and_first_step(schedule, iteration)
        plan = file_epoch_plan(
            epoch,
            record_counts=record_counts,
            layout=layout,
            seed=schedule.seed,
            shuffle=schedule.shuffle,
            drop_remainder=drop_remainder,
        )
        size = plan.shard_sizes[pipeline]
        if drop_remainder:
            data_steps = plan.num_steps
        else:
            data_steps = -(-size // per_step)
        my_paths = tf.gather(
            paths, plan.file_order[pipeline :: layout.num_input_pipelines]
        )
        records = tf.data.Dataset.from_tensor_slices(my_paths).interleave(
            reader,
            cycle_length=FILE_CYCLE_LENGTH,
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        if parse_fn is not None:
            records = records.map(
                parse_fn,
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
        stream = _Stream(
            num_elements=size,
            data_steps=data_steps,
            num_replicas=layout.num_local_replicas,
            first_replica=0,
            num_local_replicas=layout.num_local_replicas,
            per_replica_batch_size=batch,
            steps_per_window=steps_per_window,
            seed=_permutation.sub_seed(
                _permutation.epoch_seed(schedule.seed, epoch),
                _permutation.FILE_SCOPE + pipeline,
            ),
            group_sizes=plan.shard_sizes,
        )
        data = _windowed_batches(
            records,
            stream,
            first_step=first_step,
            shuffle=schedule.shuffle,
            zero_element=zero_element,
        )
        # Padding-only steps of this pipeline; the other pipelines may still
        # hold real examples there, which sets each step's count.
        padding_counts = _real_counts(
            tf.maximum(first_step, data_steps),
            plan.num_steps,
            group_sizes=plan.shard_sizes,
            per_step=per_step,
            num_local_replicas=layout.num_local_replicas,
        )
        padding = tf.data.Dataset.from_tensor_slices(padding_counts).map(
            _no_autograph(lambda count: (zero_batch, no_real, count))
        )
        return data.concatenate(padding)

    return iterations(schedule).flat_map(batches_of_iteration)
