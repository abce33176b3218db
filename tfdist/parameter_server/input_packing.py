"""A step's ticket and batches sent to its worker as one tensor.

The chief calls each step's function with its ticket and the batches it
read. TF's remote eager runtime sends every input tensor that lives on
the chief to the worker in an RPC of its own before the call: a batch
`(x, y)` and the ticket cost three RPCs per step on top of the call. TF's
own parameter-server path sends none (its workers read their own
datasets), and on small steps these RPCs are a measurable part of a
step's cost. So, where every input is a dense numeric tensor of a small
example size, the chief packs the ticket and the batches into one uint8
vector and the step function unpacks them on the worker:

    packed = [ticket, dims of each tensor...] (int64) ++ each tensor's bytes
    on the worker:  header = bitcast(packed[:8 * H], int64)
                    tensor i = bitcast(slice(packed, offset_i, bytes_i)), reshaped to its dims

The values the step sees are bit-for-bit those read on the chief, with the
static shapes of the unpacked signature. Packing costs a copy on each side,
so it is used only for examples of at most `MAX_EXAMPLE_BYTES` (tabular
features, token ids, small images) and calls of at most `MAX_CALL_BYTES`;
larger ones go as they are, and so do strings, ragged and sparse tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["Layout", "MAX_CALL_BYTES", "MAX_EXAMPLE_BYTES", "small_enough"]

#: Largest example (bytes over all tensors of a batch, per row) that is packed.
MAX_EXAMPLE_BYTES = 4096
#: Largest call (bytes over all its batches) that is packed: beyond it the
#: copies cost more than the RPCs they save (and a tensor has at most 2 GiB).
MAX_CALL_BYTES = 16 << 20

_PACKABLE = frozenset(
    {
        tf.bool,
        tf.int8,
        tf.uint8,
        tf.int16,
        tf.uint16,
        tf.float16,
        tf.bfloat16,
        tf.int32,
        tf.uint32,
        tf.float32,
        tf.int64,
        tf.uint64,
        tf.float64,
        tf.complex64,
        tf.complex128,
    }
)


def _example_bytes(spec: tf.TensorSpec) -> int | None:
    """Bytes per row of the batch dimension, or None if a later dimension is unknown."""
    dims = spec.shape.as_list()[1:] if spec.shape.rank else []
    if any(d is None for d in dims):
        return None
    return int(np.prod(dims, dtype=np.int64)) * spec.dtype.size


def small_enough(values: Any) -> bool:
    """Whether a call's dense tensors hold at most `MAX_CALL_BYTES` (its batches may be packed)."""
    total = 0
    for leaf in tf.nest.flatten(values):
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is not None and dtype is not None and shape.is_fully_defined():
            total += shape.num_elements() * tf.as_dtype(dtype).size
    return total <= MAX_CALL_BYTES


class Layout:
    """How one signature's ticket and batches are packed and unpacked.

    Args:
      specs: The specs of the step function's arguments after the ticket
        (as `RecordedFunction.get_concrete_function` receives them).

    Contract: build with `Layout.of` (None where packing does not apply);
    `pack` runs on the chief, on eager tensors or arrays matching `specs`;
    `unpack` is traced into the step function.
    """

    #: The signature of the packed argument.
    SPEC = tf.TensorSpec([None], tf.uint8, name="packed_inputs")

    def __init__(self, specs: tuple[Any, ...]) -> None:
        self._specs = specs
        self._leaves: list[tf.TensorSpec | None] = tf.nest.flatten(specs)
        self._header = 1 + sum(s.shape.rank for s in self._leaves if s is not None)

    @classmethod
    def of(cls, specs: tuple[Any, ...]) -> Layout | None:
        """A layout for `specs`, or None if they are not all small dense numeric tensors."""
        leaves = tf.nest.flatten(specs)
        tensors = [s for s in leaves if s is not None]
        if not tensors or not all(
            type(s) is tf.TensorSpec and s.dtype in _PACKABLE and s.shape.rank is not None
            for s in tensors
        ):
            return None
        sizes = [_example_bytes(s) for s in tensors]
        if any(size is None for size in sizes) or sum(sizes) > MAX_EXAMPLE_BYTES:  # type: ignore[arg-type]
            return None
        return cls(specs)

    def pack(self, ticket: int, args: tuple[Any, ...]) -> np.ndarray:
        """`ticket` and `args` (matching the specs) as one uint8 vector."""
        # In the specs' dtypes: a Python number's spec is 32-bit, its array 64.
        arrays = [
            None if spec is None else np.asarray(leaf, dtype=spec.dtype.as_numpy_dtype)
            for leaf, spec in zip(tf.nest.flatten(args), self._leaves, strict=True)
        ]
        present = [a for a in arrays if a is not None]
        header = np.array([ticket] + [d for a in present for d in a.shape], np.int64)
        # reshape(-1): contiguous (a copy only where the array is not).
        parts = [a.reshape(-1).view(np.uint8) for a in present]
        return np.concatenate([header.view(np.uint8), *parts])

    def unpack(self, packed: tf.Tensor) -> tuple[tf.Tensor, tuple[Any, ...]]:
        """(ticket, args) from a packed vector; traced on the worker."""
        header = tf.bitcast(tf.reshape(packed[: 8 * self._header], [self._header, 8]), tf.int64)
        offset = tf.constant(8 * self._header, tf.int64)
        at = 1
        values: list[tf.Tensor | None] = []
        for spec in self._leaves:
            if spec is None:
                values.append(None)
                continue
            rank = spec.shape.rank
            dims = header[at : at + rank]
            at += rank
            size = tf.reduce_prod(dims) * spec.dtype.size
            raw = tf.slice(packed, tf.reshape(offset, [1]), tf.reshape(size, [1]))
            offset += size
            if spec.dtype == tf.bool:
                flat = tf.cast(raw, tf.bool)
            elif spec.dtype.size == 1:
                flat = tf.bitcast(raw, spec.dtype)
            else:
                flat = tf.bitcast(tf.reshape(raw, [-1, spec.dtype.size]), spec.dtype)
            value = tf.reshape(flat, dims)
            value.set_shape(spec.shape)
            values.append(value)
        return header[0], tf.nest.pack_sequence_as(self._specs, values)
