"""The mesh strategy's tensors and variables, as TF's DTensor holds them.

`tf.experimental.dtensor` (public TF API) keeps a tensor as one component
per device of a mesh, each the slice its layout gives that device; an op on
such tensors runs on every device, and DTensor's SPMD expansion adds the
collectives the layouts need (an all-reduce after a row-split matmul, a
gather where an op needs a whole dimension). The mesh strategy turns
everything a Keras step touches into DTensors:

- `MeshVariable`: a `DVariable` that also accepts plain values (Keras's
  `set_weights`, `load_weights` and initial values are plain tensors:
  they are split to the variable's layout) and reads back whole
  (`numpy()`: Keras's `get_weights` and `save_weights`);
- `to_mesh(value, layout)`: a plain tensor onto the mesh, split by
  `layout` (the input batch, a variable's initial value);
- `whole(tensor)`: a DTensor gathered to every device (what `predict`
  returns, what a whole read gives).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from tfdist.mesh import layouts as layouts_lib

__all__ = ["MeshVariable", "layout", "make_mesh", "to_mesh", "whole"]


def _dtensor_device(name: str) -> str:
    """'cpu:0', '/device:CPU:0', '/job:localhost/.../device:CPU:0' -> 'CPU:0'."""
    name = name.rsplit("device:", 1)[-1].lstrip("/")
    kind, _, index = name.rpartition(":")
    return f"{kind.upper()}:{index}"


def make_mesh(spec: layouts_lib.MeshSpec) -> dtensor.Mesh:
    """DTensor's mesh over `spec`'s devices, axes and shape."""
    return dtensor.create_mesh(
        list(zip(spec.axis_names, spec.shape)),
        devices=[_dtensor_device(d) for d in spec.devices],
    )


def layout(mesh: dtensor.Mesh, axes: Sequence[str | None]) -> dtensor.Layout:
    """DTensor's layout for `axes` (None: the dimension whole)."""
    return dtensor.Layout([a if a is not None else dtensor.UNSHARDED for a in axes], mesh)


def to_mesh(value: Any, target: dtensor.Layout) -> tf.Tensor:
    """`value` as a DTensor laid out by `target` (eagerly; a DTensor is relaid out)."""
    value = tf.convert_to_tensor(value)
    if not dtensor.is_dtensor(value):
        value = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(target.mesh, value.shape.rank))
    return dtensor.relayout(value, target)


def whole(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` gathered whole on every device (in a function or eagerly)."""
    return dtensor.relayout(tensor, dtensor.Layout.replicated(dtensor.fetch_layout(tensor).mesh, tensor.shape.rank))


class MeshVariable(dtensor.DVariable):
    """A `DVariable` that takes plain values and reads back whole (module docstring).

    Args:
      initial_value: A DTensor with the variable's layout.
      **kwargs: `tf.Variable`'s (trainable, name, dtype).
    """

    def _on_mesh(self, value: Any) -> Any:
        value = tf.convert_to_tensor(value, dtype=self.dtype)
        if not tf.executing_eagerly() or dtensor.is_dtensor(value):
            return value  # In a step every value is a DTensor already.
        return to_mesh(value, self.layout)

    def numpy(self) -> np.ndarray:
        """The whole value (gathered from the devices' slices)."""
        return dtensor.unpack(whole(self.read_value()))[0].numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        del copy  # numpy() is always a fresh array.
        return np.asarray(self.numpy(), dtype=dtype)

    def assign(self, value: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> Any:
        return super().assign(self._on_mesh(value), use_locking, name, read_value)

    def assign_add(self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> Any:
        return super().assign_add(self._on_mesh(delta), use_locking, name, read_value)

    def assign_sub(self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> Any:
        return super().assign_sub(self._on_mesh(delta), use_locking, name, read_value)
