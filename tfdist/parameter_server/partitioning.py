"""How a parameter-server strategy splits variables over its ps tasks.

`resolve(variable_partitioner, num_ps)` turns the constructor's argument
into what TF's strategy takes (a partitioner, or None for whole variables):

    None (default)  -> tfdist's, by bytes: a variable of more than
                       DEFAULT_MIN_SHARD_BYTES is split by rows into
                       min(num_ps, ceil(bytes / DEFAULT_MIN_SHARD_BYTES))
                       shards of equal rows (TF's MinSizePartitioner); the
                       others stay whole, round robin over the ps tasks
    WHOLE ("whole") -> no splitting (TF's default: every variable whole)
    a callable      -> that partitioner, as TF uses it
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["DEFAULT_MIN_SHARD_BYTES", "WHOLE", "default_partitioner", "resolve"]

#: Variables up to this size stay whole by default (1 MiB: 16,384 rows of 16 float32).
DEFAULT_MIN_SHARD_BYTES = 1 << 20
#: `variable_partitioner=WHOLE` keeps every variable whole.
WHOLE = "whole"


def default_partitioner(num_ps: int) -> Any:
    """tfdist's default: by bytes, up to one shard per ps task; None for one ps."""
    if num_ps < 2:
        return None
    return tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=DEFAULT_MIN_SHARD_BYTES, max_shards=num_ps
    )


def resolve(variable_partitioner: Any, num_ps: int) -> Any:
    """The partitioner TF's strategy gets (see module); the argument is checked first.

    Raises:
      TypeError: If `variable_partitioner` is not None, "whole" or a callable.
    """
    # Any: a TF partitioner is any callable (shape, dtype) -> shards per axis.
    if variable_partitioner is None:
        return default_partitioner(num_ps)
    if variable_partitioner == WHOLE:
        return None
    if not callable(variable_partitioner):
        raise TypeError(
            "variable_partitioner must be a partitioner (a callable such as "
            "tf.distribute.experimental.partitioners.MinSizePartitioner(...)), "
            f"{WHOLE!r} (every variable whole) or None (tfdist's default, by "
            f"bytes); received variable_partitioner={variable_partitioner!r} of "
            f"type {type(variable_partitioner).__name__}."
        )
    return variable_partitioner
