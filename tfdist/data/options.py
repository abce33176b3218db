"""`ShardOptions`: how a tfdist strategy shards a plain dataset with `shard`.

tfdist strategies distribute a batched dataset given to `model.fit`,
`evaluate` or `predict` themselves, never with TF's auto-sharding:

- by default (`shard_options=None`) keeping the user's pipeline (one copy
  per worker) and cutting every global batch over the replicas;
- with `shard_options=ShardOptions(...)` by unbatching the dataset and
  sharding it with `shard_steps` (`shard`'s element policy, a step at a
  time): a deterministic per-epoch reshuffle computed by tfdist, the same
  on every worker without communication, resumable at
  `(epoch, start_step)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist import _validation as validation
from tfdist.data import _checks
from tfdist.data import policies
from tfdist.data import sharding

__all__ = ["ShardOptions"]


@dataclasses.dataclass(frozen=True)
class ShardOptions:
    """Options of `tfdist.data.shard` for a strategy's plain-dataset input.

    Pass to `tfdist.MirroredStrategy(shard_options=...)` or
    `tfdist.MultiWorkerMirroredStrategy(shard_options=...)`. The strategy
    then unbatches each dataset given to Keras and shards it with `shard`
    (element policy) at the dataset's own global batch size, so the number
    of steps per epoch is the batched dataset's.

    Contract: the dataset must be finite and its elements are read once into
    memory (or streamed, see `shard`), so randomness inside the user's
    pipeline is frozen at that first read; shuffle with `shuffle=True` here
    instead. With several workers each reads its own copy, so the copies
    must agree: unseeded `shuffle`s are given a seed all workers share, and
    other randomness (generators, random ops in `map`) is refused with a
    `ConfigError`. Under Keras 3, `fit` reads one batch from a fresh iterator to
    build the model before its first epoch, and that iterator takes epoch
    `epoch` for itself: training's first epoch is then `epoch + 1` (still a
    complete, exactly-once epoch).

    Attributes:
      seed: Seed of the permutations; the same on every worker.
      shuffle: Reshuffle per epoch (deterministically from `seed`).
      remainder: "split" (default: each replica gets the last step's real
        rows, as evenly as they divide) or "error" (refuse data that does
        not fill every step). "drop" and "pad" are refused: Keras counts
        the steps of the batched dataset (batch it with
        `drop_remainder=True` to drop the tail), and a strategy never
        needs padding rows.
      epoch: Epoch of the first iterator (`None`: 0).
      start_step: Global step within `epoch` to start at.
      max_in_memory_bytes: See `shard`.

    Raises:
      TypeError, ConfigError: On construction, for invalid values.
    """

    seed: int = 0
    shuffle: bool = True
    remainder: policies.Remainder | str = policies.Remainder.SPLIT
    epoch: int | None = None
    start_step: int = 0
    max_in_memory_bytes: int = policies.DEFAULT_MAX_IN_MEMORY_BYTES

    def __post_init__(self) -> None:
        _checks.check_seed(self.seed)
        validation.check_bool("shuffle", self.shuffle)
        value = (
            self.remainder.value
            if isinstance(self.remainder, policies.Remainder)
            else self.remainder
        )
        if value == policies.Remainder.DROP.value:
            raise errors.ConfigError(
                "ShardOptions(remainder='drop') is not supported: Keras "
                "counts the steps of the batched dataset you pass to fit, "
                "which includes the last partial batch. Batch the dataset "
                "with drop_remainder=True instead, or use remainder='split'."
            )
        if value == policies.Remainder.PAD.value:
            raise errors.ConfigError(
                "ShardOptions(remainder='pad') is not supported: a strategy "
                "gives each replica the real rows of the last step and "
                "weights them so training equals one device, so it never "
                "needs padding rows. Use remainder='split' (the default); "
                "remainder='pad' is for tfdist.data.shard in your own "
                "dataset_fn."
            )
        validation.check_one_of("remainder", value, ["split", "error"])
        if self.epoch is not None:
            validation.check_non_negative_int("epoch", self.epoch)
        validation.check_non_negative_int("start_step", self.start_step)
        validation.check_positive_int(
            "max_in_memory_bytes", self.max_in_memory_bytes
        )

    def shard_steps(
        self,
        unbatched: tf.data.Dataset,
        input_context: tf.distribute.InputContext,
        *,
        global_batch_size: int,
    ) -> tf.data.Dataset:
        """Returns `shard_steps(unbatched, input_context, ...)` with these options.

        Raises:
          ConfigError: For `remainder="pad"`, which strategies do not use
            (they give each replica the last step's real rows).
        """
        kwargs: dict[str, Any] = dataclasses.asdict(self)
        return sharding.shard_steps(
            unbatched,
            input_context,
            global_batch_size=global_batch_size,
            **kwargs,
        )
