"""The choices `shard` offers: how to split the input, and what to do with its tail."""

from __future__ import annotations

import enum

__all__ = ["DEFAULT_MAX_IN_MEMORY_BYTES", "Remainder", "ShardPolicy", "enum_value"]

#: Element policy: datasets estimated at most this large are held in memory.
DEFAULT_MAX_IN_MEMORY_BYTES = 1 << 30


class ShardPolicy(enum.Enum):
    """How `shard` splits the input over input pipelines.

    Attributes:
      AUTO: FILE when the input is file paths and there are at least as many
        files as input pipelines (and, with `remainder="error"`, the shards
        are guaranteed even); ELEMENT otherwise. Logs the choice and why.
      FILE: Each input pipeline reads whole files. Reads each file once per
        epoch over all workers.
      ELEMENT: Each input pipeline takes its replicas' slots of one global
        per-example permutation. Every pipeline reads the whole input.
    """

    AUTO = "auto"
    FILE = "file"
    ELEMENT = "element"


class Remainder(enum.Enum):
    """What `shard` does with a last global batch smaller than the others.

    Attributes:
      PAD: Fill it up with zero examples of sample weight 0, so that every
        replica gets a full per-replica batch; elements gain a weight, by
        default `global_batch_size / M` for the M real examples of a padded
        step (see `shard`'s `normalize_padded_loss`).
      SPLIT: Split its real examples over the replicas as evenly as
        possible, without padding rows (a replica may get fewer rows, or
        none). Keras-style `(x, y[, w])` elements gain a weight,
        `num_replicas_in_sync * b / M` for a replica's b rows of a step with
        M real examples (1.0 in full steps); other elements are left as they
        are. Unlike PAD, Keras's unweighted metrics and `predict` see only
        real examples; tfdist strategies with `ShardOptions` use it (and
        keep the user's elements as they are: see `shard_steps`).
      DROP: Drop it (the count is logged).
      ERROR: Raise ConfigError unless the sizes divide evenly.
    """

    PAD = "pad"
    SPLIT = "split"
    DROP = "drop"
    ERROR = "error"


def enum_value(value: object) -> object:
    """An enum member's value, anything else as it is."""
    return value.value if isinstance(value, enum.Enum) else value
