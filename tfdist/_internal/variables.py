"""Host-local variables that no strategy may mirror (TF private).

Private TF API used (tested range: see setup.py):
`resource_variable_ops.ResourceVariable`, constructed directly so that the
strategy's variable creator is skipped (TF applies the creator stack only
when the abstract `tf.Variable` class is called).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops

__all__ = ["make_local_counter"]


def make_local_counter(name: str) -> tf.Variable:
    """A new int64 scalar variable, initialised to 0, never mirrored.

    `tf.Variable(...)` under `strategy.scope()` would become a
    MirroredVariable; this one lives on the current device scope only.
    Must be called eagerly.

    Args:
      name: Variable name, for debugging.
    """
    return _resource_variable_ops.ResourceVariable(
        0, dtype=tf.int64, trainable=False, name=name
    )
