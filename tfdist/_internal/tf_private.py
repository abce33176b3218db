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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as _cross_device_ops
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import values as _values

__all__ = [
    "destination_devices",
    "is_distributed_value",
    "make_mirrored",
]


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
