"""A synchronous step's sparse gradients kept as rows, one buffer per slice, on the ps tasks.

Sync mode (`sync_runner`) sums the slices' gradients into one dense
accumulator per variable. A lookup's gradient (an `IndexedSlices` with one
row per looked-up index: Keras's `Embedding`) adds up to the same sum, but
an optimizer does not read only the sum: Keras 3's Adam, Adagrad, RMSprop,
Adamax and Ftrl square (or take the absolute value of) each row before
adding the rows of one index, so rows summed first update a table
otherwise than one device wherever an index occurs twice in a batch (a
token seen twice). A dense sum also sends every row of the table to its
ps task from every slice of every step.

`RowBuffers` keeps such a gradient as rows. Per variable and per slice
index `s` it holds two variables of unknown length on a ps task, written
by slice `s` only:

    slice s (phase 1):   indices_s := gradient.indices
                         rows_s    := gradient.values * n_s
    apply (phase 2):     gradient  := IndexedSlices(concat(rows_*) / N,
                                                    concat(indices_*))
                         indices_*, rows_* := empty

so the optimizer receives the rows one device's gradient has (each
looked-up index's row, `1/N` of its example's loss gradient), in another
order. The writes are plain `assign`s: the strategy's update gate applies
each once per scheduled function, as it does the accumulators'. Slices
that did not run in a step (a batch smaller than the workers) left their
buffers empty.

Not for rows whose indices are constants (`sparse_rows.rows_align`: a
position embedding's `range(maxlen)`): one device has one row per index
there, which the dense sum equals; each slice's rows would be one more.

Which variables have sparse gradients is learnt by tracing: a slice's
first trace writes them densely and notes them (`write` answers False);
`create` then makes their buffers, and the caller traces again.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdist.collectives import sparse_rows

__all__ = ["RowBuffers", "keeps_rows"]


def keeps_rows(gradient: Any) -> bool:
    """Whether `gradient` goes to row buffers: sparse, its indices not constants."""
    return isinstance(gradient, tf.IndexedSlices) and not sparse_rows.rows_align([gradient])


class _Buffers:
    """One variable's buffers: per slice, its indices and its scaled rows."""

    def __init__(self, indices: list[tf.Variable], rows: list[tf.Variable], shape: tf.TensorShape):
        self.indices = indices
        self.rows = rows
        self.shape = shape


class RowBuffers:
    """Row buffers of the variables whose gradients `keeps_rows` (see module).

    Used from one thread (the chief's, which traces Keras's functions).

    Args:
      num_slices: Slices per step, at most (the worker tasks).
    """

    def __init__(self, num_slices: int) -> None:
        self._num_slices = num_slices
        self._buffers: dict[int, _Buffers] = {}
        # Variables seen with sparse gradients and no buffers yet, by id:
        # (variable, index dtype, row dtype, row shape).
        self._found: dict[int, tuple[Any, tf.DType, tf.DType, tf.TensorShape]] = {}

    def __bool__(self) -> bool:
        return bool(self._buffers)

    def has(self, variable: Any) -> bool:
        return id(variable) in self._buffers

    def write(self, slice_index: int, variable: Any, gradient: tf.IndexedSlices, size: Any) -> bool:
        """While tracing slice `slice_index`: writes `gradient`'s rows times `size`.

        Returns False, writing nothing, for a variable without buffers yet
        (noted for `create`); the caller then accumulates it densely.
        """
        buffers = self._buffers.get(id(variable))
        if buffers is None:
            values = gradient.values
            self._found[id(variable)] = (
                variable, gradient.indices.dtype, values.dtype, values.shape[1:]
            )
            return False
        buffers.indices[slice_index].assign(gradient.indices)
        buffers.rows[slice_index].assign(gradient.values * tf.cast(size, gradient.values.dtype))
        return True

    def create(self, strategy: tf.distribute.Strategy) -> bool:
        """Makes the buffers of the variables `write` noted; whether there were any.

        Call outside any trace, after a slice's trace and before the apply's.
        """
        found, self._found = self._found, {}
        with strategy.scope():
            for key, (variable, index_dtype, row_dtype, row_shape) in found.items():
                self._buffers[key] = _Buffers(
                    [_empty([0], index_dtype, "indices") for _ in range(self._num_slices)],
                    [_empty([0, *row_shape], row_dtype, "rows") for _ in range(self._num_slices)],
                    tf.TensorShape(variable.shape),
                )
        return bool(found)

    def gradient(self, variable: Any, scale: tf.Tensor) -> tf.IndexedSlices:
        """While tracing the apply: the step's rows of `variable`, times `scale`."""
        buffers = self._buffers[id(variable)]
        row_shape = buffers.shape[1:].as_list()
        rows = tf.concat(
            [tf.reshape(buffer.read_value(), [-1, *row_shape]) for buffer in buffers.rows], axis=0
        )
        return tf.IndexedSlices(
            rows * tf.cast(scale, rows.dtype),
            tf.concat([tf.reshape(b.read_value(), [-1]) for b in buffers.indices], axis=0),
            tf.constant(buffers.shape.as_list(), tf.int64),
        )

    def clear(self) -> None:
        """While tracing the apply, after `gradient`s are applied: every buffer emptied."""
        for buffers in self._buffers.values():
            for buffer in buffers.indices:
                buffer.assign(tf.zeros([0], buffer.dtype))
            for buffer in buffers.rows:
                buffer.assign(tf.zeros([0, *buffers.shape[1:].as_list()], buffer.dtype))


def _empty(shape: list[int], dtype: tf.DType, name: str) -> tf.Variable:
    """A variable holding no rows, of any shape on assignment (read back reshaped).

    Of unknown rank, not `[None, ...]`: a worker that receives the handle
    of a ps variable whose shape is partly known aborts in TF 2.21
    (`RemoteMgr::DeserializeRemoteTensorHandle`: "Check failed: size >= 0").
    """
    return tf.Variable(
        tf.zeros(shape, dtype),
        shape=tf.TensorShape(None),
        trainable=False,
        name=f"tfdist_sync_{name}",
    )
