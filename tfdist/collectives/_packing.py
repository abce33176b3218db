"""Gradient bucketing: many small tensors -> few flat buckets, and back.

One `batch_reduce` call carries every gradient of a step. Reducing each
separately costs one collective (and its per-step latency) per variable;
packing them costs one concat per bucket on each device and one split after.

    order tensors as given; group by dtype (stable)
    fill buckets greedily up to bucket_bytes; a tensor larger than
    bucket_bytes gets a bucket of its own (it is never split)
    pack:   per device, bucket = concat([reshape(t, [-1]) for t in bucket])
    unpack: per device, split(bucket, sizes) and reshape each piece

A bucket of one tensor is only reshaped, never copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

__all__ = ["Bucket", "pack", "plan_buckets", "reindex", "unpack"]


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Which tensors (by index in the batch) travel together.

    Attributes:
      indices: Positions in the batch of the tensors in this bucket.
      shapes: Their static shapes.
      dtype: Their common dtype.
    """

    indices: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: tf.DType

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(int(np.prod(shape)) for shape in self.shapes)


def plan_buckets(
    shapes: Sequence[tuple[int, ...]],
    dtypes: Sequence[tf.DType],
    bucket_bytes: int | None,
) -> list[Bucket]:
    """Groups tensors into buckets of at most `bucket_bytes` per dtype.

    Args:
      shapes: Fully defined static shape of each tensor.
      dtypes: Dtype of each tensor.
      bucket_bytes: Byte cap per bucket; `None` puts each tensor alone.

    Returns:
      Buckets covering every index exactly once, in first-seen dtype order.
    """
    by_dtype: dict[tf.DType, list[int]] = {}
    for index, dtype in enumerate(dtypes):
        by_dtype.setdefault(dtype, []).append(index)
    buckets = []
    for dtype, indices in by_dtype.items():
        current: list[int] = []
        current_bytes = 0
        for index in indices:
            nbytes = int(np.prod(shapes[index])) * dtype.size
            if current and (
                bucket_bytes is None or current_bytes + nbytes > bucket_bytes
            ):
                buckets.append(_bucket(current, shapes, dtype))
                current, current_bytes = [], 0
            current.append(index)
            current_bytes += nbytes
        if current:
            buckets.append(_bucket(current, shapes, dtype))
    return buckets


def reindex(bucket: Bucket, positions: Sequence[int]) -> Bucket:
    """`bucket` planned over a reordered list, in the original positions.

    Args:
      bucket: A bucket whose `indices` index the reordered list.
      positions: `positions[i]` is the original index of reordered item i.
    """
    return dataclasses.replace(
        bucket, indices=tuple(positions[i] for i in bucket.indices)
    )


def _bucket(
    indices: list[int], shapes: Sequence[tuple[int, ...]], dtype: tf.DType
) -> Bucket:
    return Bucket(tuple(indices), tuple(tuple(shapes[i]) for i in indices), dtype)


def pack(tensors: Sequence[tf.Tensor], bucket: Bucket, device: str) -> tf.Tensor:
    """Flattens the bucket's tensors (from one device) into one 1-D tensor."""
    with tf.device(device):
        flat = [tf.reshape(tensors[i], [-1]) for i in bucket.indices]
        return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)


def unpack(flat: tf.Tensor, bucket: Bucket, device: str) -> list[tf.Tensor]:
    """Inverse of `pack`: the bucket's tensors, in bucket order."""
    with tf.device(device):
        pieces = [flat] if len(bucket.indices) == 1 else tf.split(flat, bucket.sizes)
        return [
            tf.reshape(piece, shape) for piece, shape in zip(pieces, bucket.shapes)
        ]
