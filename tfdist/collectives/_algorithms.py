"""All-reduce algorithms over the devices of one process.

Each algorithm takes one dense 1-D tensor per device (same length and dtype,
each already on its device) and returns one tensor per device holding the
element-wise SUM, placed on that device. Every op is pinned with
`tf.device`, so in a `tf.function` TensorFlow inserts the Send/Recv pairs
the algorithm describes, and nothing else.

A transfer can be compressed: the sender casts to `wire_dtype`, the receiver
casts back, and every addition happens in the original dtype (float32
accumulation for fp16/bf16 compression).

Ring (reduce-scatter, then all-gather; n chunks, 2(n-1) steps)::

    split every x_i into n chunks c_i[0..n-1]
    for s in 0..n-2:                          # reduce-scatter
        for i: c_{i+1}[(i-s) % n] += send(c_i[(i-s) % n], i -> i+1)
    # now device i owns the full sum of chunk (i+1) % n
    for s in 0..n-2:                          # all-gather
        for i: c_{i+1}[(i+1-s) % n] = send(c_i[(i+1-s) % n], i -> i+1)
    x_i = concat(c_i)

Tree (binary reduce to device 0, then broadcast down; 2*ceil(log2 n) steps)::

    for stride in 1, 2, 4, ... < n:           # reduce
        for i in 0, 2*stride, 4*stride, ... with i+stride < n:
            x_i += send(x_{i+stride}, i+stride -> i)
    for stride in ..., 4, 2, 1:               # broadcast
        x_{i+stride} = send(x_i, i -> i+stride)

Reduce-to-one (AddN on device 0, then one copy per device)::

    total = add_n(send(x_i, i -> 0) for i)
    x_i = send(total, 0 -> i)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

__all__ = [
    "ALGORITHMS",
    "reduce_to_one_all_reduce",
    "ring_all_reduce",
    "send",
    "tree_all_reduce",
]

AllReduceFn = Callable[
    [Sequence[tf.Tensor], Sequence[str], "tf.DType | None"], list[tf.Tensor]
]


def send(
    value: tf.Tensor,
    source: str,
    destination: str,
    wire_dtype: tf.DType | None,
) -> tf.Tensor:
    """Moves `value` from `source` to `destination`, optionally compressed.

    Compression applies only to floating-point values wider than
    `wire_dtype`; the result has `value`'s dtype.
    """
    if (
        wire_dtype is None
        or not value.dtype.is_floating
        or value.dtype.size <= wire_dtype.size
    ):
        with tf.device(destination):
            return tf.identity(value)
    with tf.device(source):
        packed = tf.cast(value, wire_dtype)
    with tf.device(destination):
        return tf.cast(packed, value.dtype)


def ring_all_reduce(
    values: Sequence[tf.Tensor],
    devices: Sequence[str],
    wire_dtype: tf.DType | None = None,
) -> list[tf.Tensor]:
    """Ring all-reduce (SUM) of 1-D tensors; see the module docstring."""
    n = len(values)
    if n == 1:
        return [tf.identity(values[0])]
    size = int(values[0].shape[0])
    if size < n:  # Too small to chunk: every chunk would be empty.
        return tree_all_reduce(values, devices, wire_dtype)
    # Chunk boundaries: the first `size % n` chunks get one extra element, so
    # no padding copy is needed.
    base, extra = divmod(size, n)
    lengths = [base + (1 if c < extra else 0) for c in range(n)]
    chunks: list[list[tf.Tensor]] = []
    for i, value in enumerate(values):
        with tf.device(devices[i]):
            chunks.append(list(tf.split(value, lengths)))
    for step in range(n - 1):
        for i in range(n):
            chunk, destination = (i - step) % n, (i + 1) % n
            received = send(
                chunks[i][chunk], devices[i], devices[destination], wire_dtype
            )
            with tf.device(devices[destination]):
                chunks[destination][chunk] = tf.add(
                    chunks[destination][chunk], received
                )
    for step in range(n - 1):
        for i in range(n):
            chunk, destination = (i + 1 - step) % n, (i + 1) % n
            chunks[destination][chunk] = send(
                chunks[i][chunk], devices[i], devices[destination], wire_dtype
            )
    outputs = []
    for i in range(n):
        with tf.device(devices[i]):
            outputs.append(tf.concat(chunks[i], axis=0))
    return outputs


def tree_all_reduce(
    values: Sequence[tf.Tensor],
    devices: Sequence[str],
    wire_dtype: tf.DType | None = None,
) -> list[tf.Tensor]:
    """Binary-tree reduce then broadcast (SUM); see the module docstring."""
    n = len(values)
    partial = list(values)
    strides = []
    stride = 1
    while stride < n:
        strides.append(stride)
        for i in range(0, n - stride, 2 * stride):
            received = send(
                partial[i + stride], devices[i + stride], devices[i], wire_dtype
            )
            with tf.device(devices[i]):
                partial[i] = tf.add(partial[i], received)
        stride *= 2
    result: list[tf.Tensor | None] = [partial[0]] + [None] * (n - 1)
    for stride in reversed(strides):
        for i in range(0, n - stride, 2 * stride):
            result[i + stride] = send(
                result[i], devices[i], devices[i + stride], wire_dtype
            )
    return [t for t in result if t is not None]  # Every slot is now set.


def reduce_to_one_all_reduce(
    values: Sequence[tf.Tensor],
    devices: Sequence[str],
    wire_dtype: tf.DType | None = None,
) -> list[tf.Tensor]:
    """AddN on the first device, then a copy to every device (SUM)."""
    root = devices[0]
    gathered = [
        value if i == 0 else send(value, devices[i], root, wire_dtype)
        for i, value in enumerate(values)
    ]
    with tf.device(root):
        total = tf.math.add_n(gathered) if len(gathered) > 1 else tf.identity(
            gathered[0]
        )
    return [total] + [
        send(total, root, device, wire_dtype) for device in devices[1:]
    ]


#: Algorithm name -> implementation; names are those users pass as
#: `all_reduce=` (plus "auto", which chooses among these per call).
ALGORITHMS: dict[str, AllReduceFn] = {
    "ring": ring_all_reduce,
    "tree": tree_all_reduce,
    "reduce_to_one": reduce_to_one_all_reduce,
}
