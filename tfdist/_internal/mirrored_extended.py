"""TF's MirroredStrategy implementation class and its update helpers (TF private).

`tfdist.MirroredStrategy` subclasses TF's `MirroredExtended` to override
`_update` (apply an update once on host-memory devices and copy it); the
underscore `StrategyExtended` methods are TF's real (private) strategy
contract. Private TF API used (tested range: see setup.py):

- `mirrored_strategy.MirroredExtended`: the class to subclass;
- `values.MirroredVariable`: recognising mirrored variables;
- `distribute_utils.select_replica` / `update_regroup` and
  `distribute_lib.UpdateContext`: what TF's own `_update` does around
  each device's update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorflow.python.distribute import distribute_lib as _distribute_lib
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import mirrored_strategy as _mirrored_strategy
from tensorflow.python.distribute import values as _values

from tfdist._internal import update_hook

__all__ = [
    "MirroredExtended",
    "UpdateHookExtended",
    "is_mirrored_variable",
    "select_replica",
    "update_context",
    "update_regroup",
]

#: TF's implementation class behind tf.distribute.MirroredStrategy.
MirroredExtended = _mirrored_strategy.MirroredExtended


def is_mirrored_variable(value: Any) -> bool:
    """True for a MirroredVariable (one identical copy per device)."""
    return isinstance(value, _values.MirroredVariable)


def select_replica(replica_index: int, structure: Any) -> Any:
    """`structure` with every distributed value replaced by its component."""
    return _distribute_utils.select_replica(replica_index, structure)


def update_context(replica_index: int) -> Any:
    """The context TF's own `_update` runs each device's update in."""
    return _distribute_lib.UpdateContext(replica_index)


def update_regroup(extended: Any, updates: Sequence[Any], group: bool) -> Any:
    """Per-device update results as `StrategyExtended.update` returns them."""
    return _distribute_utils.update_regroup(extended, list(updates), group)


class UpdateHookExtended(update_hook.UpdateHook, MirroredExtended):  # type: ignore[misc,valid-type]
    """TF's MirroredExtended whose variable updates go through a public hook.

    See `update_hook.UpdateHook`: a subclass overrides `update_variable`.
    """
