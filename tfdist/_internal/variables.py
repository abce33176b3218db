"""Variables outside a strategy's reach: host-local counters, and moving one (TF private).

Private TF API used (tested range: see setup.py):

- `resource_variable_ops.ResourceVariable`, constructed directly so that the
  strategy's variable creator is skipped (TF applies the creator stack only
  when the abstract `tf.Variable` class is called);
- `resource_variable_ops.eager_safe_variable_handle` and a variable's
  `_handle`: `move_variable` gives an existing variable object a new
  resource on another device (TF has no public way to move a variable, and
  Keras, optimizers and checkpoints hold on to the object itself).
"""

from __future__ import annotations

import weakref

import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops as _gen_resource_variable_ops
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops

__all__ = ["is_resource_variable", "make_local_counter", "move_variable"]


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


def is_resource_variable(value: object) -> bool:
    """True for a plain (eager) resource variable, the kind `move_variable` moves."""
    return isinstance(value, _resource_variable_ops.BaseResourceVariable)


def move_variable(variable: tf.Variable, device: str) -> None:
    """Moves `variable`'s storage to `device`, keeping the same Python object.

    A new resource is created on `device` holding the current value; the
    variable's handle is swapped to it and the old resource is freed once
    nothing refers to it. Everything that holds the variable object (a
    Keras layer, an optimizer, a checkpoint) sees the new device; a
    `tf.function` traced before the move still captures the old resource,
    so move variables before the functions that use them are traced.

    Must be called eagerly (or under `tf.init_scope()`). A variable already
    on `device` is left alone.

    Args:
      variable: An eager resource variable.
      device: A device name, e.g. "/device:CPU:1".
    """
    target = tf.DeviceSpec.from_string(device)
    current = tf.DeviceSpec.from_string(variable.device)
    if (current.device_type, current.device_index) == (
        target.device_type,
        target.device_index,
    ):
        return
    with tf.init_scope(), tf.device(device):
        value = variable.read_value()
        handle = _resource_variable_ops.eager_safe_variable_handle(
            initial_value=value,
            shape=variable.shape,
            shared_name=None,
            name=variable.name.split(":")[0],
            graph_mode=False,
        )
        _gen_resource_variable_ops.assign_variable_op(handle, value)
    old = variable._handle
    # What TF sets on a new variable's handle (resource_variable_ops).
    handle._parent_trackable = weakref.ref(variable)
    handle._name = old._name
    handle._unique_id = old._unique_id
    variable._handle = handle
