"""Whether the sparse gradient rows of several parts of a batch are the same rows.

A lookup's gradient (`tf.gather`'s; Keras's `Embedding`) is an
`IndexedSlices` with one row per looked-up index. Summing such gradients
over replicas (or microbatches) by concatenating their rows is what TF's
strategies do, and it is what one device computes when the indices come
from the batch (token ids): one device's rows are the parts' rows together.

It is not what one device computes when the indices are fixed, the same
whatever the batch (a position embedding's `range(maxlen)`): the lookup's
output then has no batch dimension, so one device has one row per position,
summed over the whole batch, and each part one row per position summed over
its share. A sum of gradients is the same either way, so SGD and momentum
see no difference; but Keras applies Adam, Adagrad and RMSprop sparsely and
squares each row before adding rows of the same index, so concatenated rows
train other weights than one device (the keras-io transformer's position
embedding under TF's MirroredStrategy).

`rows_align(slices)` tells the two apart from the graph: when every part's
indices are computed from constants alone (no input, variable, random or
other stateful op among their producers), every part looked up the same
indices in the same order, and one device's row r is the sum of the parts'
rows r; `sum_aligned` builds that gradient. In eager mode, or for indices
that depend on anything else, it answers False and rows are concatenated.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf  # type: ignore[import-untyped]

__all__ = ["rows_align", "sum_aligned"]

# Graph ops visited at most per indices tensor before answering False (a
# lookup of constants has a handful of producers; batch-derived indices
# reach an input within a few ops, so the bound is rarely approached).
_MAX_OPS = 2000


def _from_constants(tensor: tf.Tensor) -> bool:
    """Whether `tensor` is computed in its graph from constants alone."""
    if tf.executing_eagerly() or not hasattr(tensor, "op") or not hasattr(tensor, "graph"):
        return False
    seen: set[str] = set()
    stack = [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if len(seen) > _MAX_OPS:
            return False
        if not op.inputs:
            if op.type != "Const":  # A placeholder, variable, iterator, ...
                return False
            continue
        try:
            stateful = op.op_def.is_stateful
        except Exception:  # noqa: BLE001 - an op without a registered def.
            return False
        if stateful:  # Random draws, reads of resources, iterators.
            return False
        stack.extend(inp.op for inp in op.inputs)
    return True


def rows_align(slices: Sequence[tf.IndexedSlices]) -> bool:
    """Whether row r of every part stands for row r of one device's gradient.

    True when each part's indices are computed from constants alone and
    their values have one fully defined shape. Parts on other workers run
    the same program, so this holds for theirs too.
    """
    if not slices:
        return False
    shape = slices[0].values.shape
    if not shape.is_fully_defined() or any(s.values.shape != shape for s in slices):
        return False
    return all(_from_constants(s.indices) for s in slices)


def sum_aligned(slices: Sequence[tf.IndexedSlices]) -> tf.IndexedSlices:
    """One device's gradient from aligned parts (`rows_align`): rows summed."""
    return tf.IndexedSlices(
        tf.add_n([s.values for s in slices]), slices[0].indices, slices[0].dense_shape
    )
