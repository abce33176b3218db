"""Every tfdist use of TensorFlow internals, in one place.

Tested TF range: 2.16 <= TF < 2.22 (see setup.py); written and verified
against TF 2.21.0 with Keras 3.15 and tf-keras 2.21. When TensorFlow moves a
symbol below, this module is the only one to change.

Why each import is needed:

- `distribute_utils.regroup` + `values.Mirrored`: a `CrossDeviceOps` must
  return `Mirrored` values, and TF has no public constructor for them.
- `cross_device_ops.get_devices_from` / `check_destinations`: resolve a
  `destinations` argument (a string, variable, tensor or DistributedValues)
  to canonical device strings exactly as TF's own ops do.
- `mirrored_strategy.MirroredExtended` and its update helpers
  (`distribute_lib.UpdateContext`, `distribute_utils.select_replica`,
  `update_regroup`): `tfdist.MirroredStrategy` overrides `_update` to apply
  an update once on host-memory devices; the `StrategyExtended` underscore
  methods are TF's real (private) strategy contract.
- `resource_variable_ops.ResourceVariable`: a variable that bypasses the
  strategy's variable creator (input-pipeline state must not be mirrored).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as _cross_device_ops
from tensorflow.python.distribute import distribute_lib as _distribute_lib
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import mirrored_strategy as _mirrored_strategy
from tensorflow.python.distribute import values as _values
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops

__all__ = [
    "MirroredExtended",
    "destination_devices",
    "has_per_replica",
    "is_distributed_value",
    "is_mirrored_variable",
    "make_local_counter",
    "make_mirrored",
    "select_replica",
    "update_context",
    "update_regroup",
]

#: TF's implementation class behind tf.distribute.MirroredStrategy.
MirroredExtended = _mirrored_strategy.MirroredExtended


def make_mirrored(per_device: Sequence[Any]) -> Any:
    """Wraps one tensor (or IndexedSlices) per device as `Mirrored`.

    A single value is returned as is, as TF's own CrossDeviceOps do.
    """
    return _distribute_utils.regroup(tuple(per_device), wrap_class=_values.Mirrored)


def destination_devices(destinations: Any, fallback: Any) -> tuple[str, ...]:
    """Canonical device strings of `destinations`, else of `fallback`.

    Mirrors TF's CrossDeviceOps: an empty destination means "the devices the
    value lives on".
    """
    target = (
        destinations
        if _cross_device_ops.check_destinations(destinations)
        else fallback
    )
    return tuple(_cross_device_ops.get_devices_from(target))


def is_distributed_value(value: Any) -> bool:
    """True for PerReplica, Mirrored and other DistributedValues."""
    return isinstance(value, tf.distribute.DistributedValues)


def is_mirrored_variable(value: Any) -> bool:
    """True for a MirroredVariable (one identical copy per device)."""
    return isinstance(value, _values.MirroredVariable)


def has_per_replica(structure: Any) -> bool:
    """True if any leaf of `structure` differs per replica (PerReplica)."""
    return any(
        isinstance(leaf, _values.PerReplica)
        for leaf in tf.nest.flatten(structure, expand_composites=False)
    )


def select_replica(replica_index: int, structure: Any) -> Any:
    """`structure` with every distributed value replaced by its component."""
    return _distribute_utils.select_replica(replica_index, structure)


def update_context(replica_index: int) -> Any:
    """The context TF's own `_update` runs each device's update in."""
    return _distribute_lib.UpdateContext(replica_index)


def update_regroup(extended: Any, updates: Sequence[Any], group: bool) -> Any:
    """Per-device update results as `StrategyExtended.update` returns them."""
    return _distribute_utils.update_regroup(extended, list(updates), group)


def make_local_counter(name: str) -> tf.Variable:
    """A new int64 scalar variable, initialised to 0, never mirrored.

    `tf.Variable(...)` under `strategy.scope()` goes through the strategy's
    variable creator and becomes a MirroredVariable. Constructing
    `ResourceVariable` directly skips the creator stack (it is applied only
    when the abstract `tf.Variable` class is called). The variable lives on
    the current device scope. Must be called eagerly.

    Args:
      name: Variable name, for debugging.
    """
    return _resource_variable_ops.ResourceVariable(
        0, dtype=tf.int64, trainable=False, name=name
    )
