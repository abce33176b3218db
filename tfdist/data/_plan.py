"""Pure index math of the dataset sharder: which positions each replica gets.

Nothing here imports TensorFlow. Every function is written with arithmetic
operators plus a few functions of an array namespace `xp` (`where`,
`minimum`, `arange`, ...; see `ArrayNamespace`), so the same code runs on
numpy arrays (the default: fast property tests, static plans) and on int64
TF tensors inside tf.data functions (`_pipeline.TF_INT64`: plans that depend
on a runtime epoch, such as the file policy's per-epoch shard sizes).

Vocabulary. An epoch is an ordered stream of `num_elements` *positions*
`0 .. num_elements - 1` (the permutation from positions to dataset elements
lives in `_permutation.py`). A *group* of `num_replicas` replicas consumes
`num_replicas * per_replica_batch_size` positions per step:

    per_step = num_replicas * b                      # b = per-replica batch
    full_steps = num_elements // per_step
    for step k < full_steps:                         # contiguous slices
        replica r, slot i  <-  position k * per_step + r * b + i
    step k == full_steps (only if a tail of M > 0 positions is left):
        replica r gets m_r = M // g + (r < M % g) real positions, contiguous
        from offset r * (M // g) + min(r, M % g); slots i >= m_r are padding
    later steps: padding only (-1)

Padding is marked by position -1. The tail is balanced over replicas, so no
replica gets a batch of padding while another has real examples to spare,
and concatenating replicas' real slots in order gives the positions in
order (the global batch, as a single device would see it).

Real examples per global step. A global step may be shared by several
groups (file policy: one group per input pipeline, each with its own
number of positions); group q holds `min(max(n_q - k * per_step, 0),
per_step)` real positions at step k, and the step's total is the sum over
groups (`real_elements_per_step`). The sharder scales sample weights by
`global_batch_size / total` so that a padded step's loss is the mean over
its real examples.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Protocol

import numpy as np

#: Position that marks a padding slot.
PADDING = -1

# `Any` below: an array of the namespace `xp` (numpy or TF tensors).
Array = Any


class ArrayNamespace(Protocol):
    """The functions of `numpy` this module uses, on integer arrays."""

    int64: Any  # The namespace's int64 dtype object.

    def where(self, condition: Array, x: Array, y: Array) -> Array: ...
    def minimum(self, x: Array, y: Array) -> Array: ...
    def maximum(self, x: Array, y: Array) -> Array: ...
    def arange(self, start: Array, stop: Array, *, dtype: Any) -> Array: ...
    def concatenate(self, arrays: list[Array]) -> Array: ...
    def zeros(self, shape: list[int], dtype: Any) -> Array: ...
    def asarray(self, array: Array, dtype: Any) -> Array: ...
    def reshape(self, array: Array, shape: list[int]) -> Array: ...
    def sum(self, array: Array, axis: int) -> Array: ...
    def min(self, array: Array) -> Array: ...
    def max(self, array: Array) -> Array: ...


# numpy satisfies ArrayNamespace structurally; mypy cannot check a module
# against a protocol with these overloads, hence the `Any`.
NUMPY: Any = np


@dataclasses.dataclass(frozen=True)
class ReplicaLayout:
    """Which replicas one input pipeline feeds.

    Attributes:
      num_replicas_in_sync: Replicas over all workers.
      num_input_pipelines: Input pipelines (usually one per worker).
      input_pipeline_id: This pipeline, in [0, num_input_pipelines).
      per_replica_batch_size: Elements per replica per step.
    """

    num_replicas_in_sync: int
    num_input_pipelines: int
    input_pipeline_id: int
    per_replica_batch_size: int

    @property
    def num_local_replicas(self) -> int:
        """Replicas this pipeline feeds, one per consecutive batch."""
        return self.num_replicas_in_sync // self.num_input_pipelines

    @property
    def first_replica(self) -> int:
        """Global index of this pipeline's first replica."""
        return self.input_pipeline_id * self.num_local_replicas

    @property
    def global_batch_size(self) -> int:
        """Elements per global step."""
        return self.num_replicas_in_sync * self.per_replica_batch_size

    @property
    def pipeline_batch_size(self) -> int:
        """Elements this pipeline yields per global step."""
        return self.num_local_replicas * self.per_replica_batch_size


def steps_per_epoch(
    num_elements: int, global_batch_size: int, *, drop_remainder: bool
) -> int:
    """Returns how many global steps an epoch of `num_elements` makes.

    Args:
      num_elements: Elements in the epoch, >= 0.
      global_batch_size: Elements per global step, >= 1.
      drop_remainder: Whether an incomplete last global batch is dropped
        (otherwise it is padded to a full step).

    Returns:
      `num_elements // global_batch_size` when dropping, else the ceiling.
    """
    if drop_remainder:
        return num_elements // global_batch_size
    return -(-num_elements // global_batch_size)


def slot_positions(
    step: Array,
    replica: Array,
    slot: Array,
    *,
    num_elements: Array,
    num_replicas: int,
    per_replica_batch_size: int,
    xp: ArrayNamespace = NUMPY,
) -> Array:
    """Maps (step, replica, slot) to the epoch position it holds, or PADDING.

    All array arguments broadcast against each other. See the module
    docstring for the assignment.

    Args:
      step: Global step index (within the epoch), >= 0.
      replica: Replica index within the group, in [0, num_replicas).
      slot: Index within the per-replica batch, in [0, per_replica_batch_size).
      num_elements: Positions in the epoch (scalar; may be a tensor).
      num_replicas: Replicas in the group that shares each step.
      per_replica_batch_size: Elements per replica per step.
      xp: Array namespace: numpy (default) or `_pipeline.TF_INT64`.

    Returns:
      An int array of broadcast shape: the position, or `PADDING` (-1).
    """
    batch = per_replica_batch_size
    per_step = num_replicas * batch
    full_steps = num_elements // per_step
    tail = num_elements - full_steps * per_step
    tail_base = tail // num_replicas
    tail_extra = tail % num_replicas
    tail_count = tail_base + xp.where(replica < tail_extra, 1, 0)
    tail_offset = replica * tail_base + xp.minimum(replica, tail_extra)
    full_position = step * per_step + replica * batch + slot
    tail_position = full_steps * per_step + tail_offset + slot
    in_tail = (step == full_steps) & (slot < tail_count)
    return xp.where(
        step < full_steps,
        full_position,
        xp.where(in_tail, tail_position, PADDING),
    )


def pipeline_positions(
    *,
    num_elements: Array,
    num_steps: Array,
    num_replicas: int,
    first_replica: int,
    num_local_replicas: int,
    per_replica_batch_size: int,
    first_step: Array = 0,
    xp: ArrayNamespace = NUMPY,
) -> Array:
    """Positions for one input pipeline's replicas, steps first_step..num_steps.

    The strategy hands consecutive per-replica batches of a pipeline to its
    local replicas in order, so row `(k, j)` of the result is the batch of
    replica `first_replica + j` at step `first_step + k`.

    Args:
      num_elements: Positions in the epoch.
      num_steps: Steps in the epoch (padding-only steps past the data are
        allowed; they come out as PADDING).
      num_replicas: Replicas that share each step (the group).
      first_replica: Group index of this pipeline's first replica.
      num_local_replicas: Replicas this pipeline feeds.
      per_replica_batch_size: Elements per replica per step.
      first_step: First step to emit (resumption), <= num_steps.
      xp: Array namespace: numpy (default) or `_pipeline.TF_INT64`.

    Returns:
      int64 array `[num_steps - first_step, num_local_replicas,
      per_replica_batch_size]` of positions or PADDING.
    """
    step = xp.arange(first_step, num_steps, dtype=xp.int64)[:, None, None]
    replica = xp.arange(
        first_replica, first_replica + num_local_replicas, dtype=xp.int64
    )[None, :, None]
    slot = xp.arange(0, per_replica_batch_size, dtype=xp.int64)[None, None, :]
    return slot_positions(
        step,
        replica,
        slot,
        num_elements=num_elements,
        num_replicas=num_replicas,
        per_replica_batch_size=per_replica_batch_size,
        xp=xp,
    )


def round_robin_shard_sizes(
    ordered_counts: Array, num_shards: int, *, xp: ArrayNamespace = NUMPY
) -> Array:
    """Sums of `ordered_counts[q::num_shards]` for every shard q.

    File policy: the files of an epoch, in that epoch's order, are dealt to
    input pipelines round robin; this gives each pipeline's element count.

    Args:
      ordered_counts: int64 vector `[num_files]` of records per file, in the
        epoch's file order. Its length must be static.
      num_shards: Number of shards (input pipelines), >= 1.
      xp: Array namespace: numpy (default) or `_pipeline.TF_INT64`.

    Returns:
      int64 vector `[num_shards]`.
    """
    num_files = int(ordered_counts.shape[0])
    pad = -num_files % num_shards
    padded = xp.concatenate(
        [xp.asarray(ordered_counts, xp.int64), xp.zeros([pad], xp.int64)]
    )
    return xp.sum(xp.reshape(padded, [-1, num_shards]), axis=0)


def shard_steps(
    shard_sizes: Array,
    per_step: int,
    *,
    drop_remainder: bool,
    xp: ArrayNamespace = NUMPY,
) -> Array:
    """Steps every shard runs when shards of unequal size must stay in step.

    Args:
      shard_sizes: Elements per shard.
      per_step: Elements a shard consumes per step.
      drop_remainder: If true, the smallest shard's full steps (larger
        shards drop their excess); else the largest shard's steps, rounded
        up (smaller shards pad).
      xp: Array namespace: numpy (default) or `_pipeline.TF_INT64`.

    Returns:
      A scalar step count.
    """
    if drop_remainder:
        return xp.min(shard_sizes // per_step)
    return xp.max(-(-shard_sizes // per_step))


def min_round_robin_shard_size(counts: Array, num_shards: int) -> int:
    """Smallest element count any shard can get from a round-robin deal.

    Each shard gets at least `len(counts) // num_shards` files, so the worst
    case is the sum of that many smallest files.

    Args:
      counts: Records per file.
      num_shards: Number of shards, >= 1.

    Returns:
      The lower bound, as a Python int.
    """
    smallest = np.sort(np.asarray(counts, dtype=np.int64))
    return int(smallest[: len(smallest) // num_shards].sum())


def real_elements_per_step(
    step: Array,
    *,
    group_sizes: Array,
    per_step: int,
    xp: ArrayNamespace = NUMPY,
) -> Array:
    """Real (non-padding) positions at each global step, over all groups.

    Each group of replicas that shares a global step consumes `per_step`
    positions per step from its own stream of `group_sizes[q]` positions
    (see `slot_positions`), so at step k it holds
    `min(max(group_sizes[q] - k * per_step, 0), per_step)` real ones.

    Args:
      step: int64 vector `[num]` of global step indices, >= 0.
      group_sizes: int64 vector `[num_groups]`: positions of every group
        sharing the step (element policy: `[num_elements]`; file policy:
        every input pipeline's shard size). Its length must be static.
      per_step: Positions each group consumes per step.
      xp: Array namespace: numpy (default) or `_pipeline.TF_INT64`.

    Returns:
      int64 vector `[num]`: the real positions of each step, summed over
      groups (`num_groups * per_step` for a full step).
    """
    remaining = (
        xp.reshape(xp.asarray(group_sizes, xp.int64), [1, -1])
        - xp.reshape(xp.asarray(step, xp.int64), [-1, 1]) * per_step
    )
    real = xp.minimum(xp.maximum(remaining, 0), per_step)
    return xp.sum(real, axis=1)
