"""The `StrategyExtended` behind `tfdist.MeshStrategy`: every variable a DTensor on the mesh.

One replica, as Keras sees it: the whole mesh runs each step as one
program (DTensor's SPMD), so Keras's loss needs no per-replica scaling and
its reductions and gradient sums are of one value. TF's one-replica
contract is `_internal/single_replica.SingleReplicaExtended`; this class
decides, through its public hooks, that every variable created under the
strategy's scope is a `MeshVariable` laid out by the layout rules:

- a Keras 3 variable by its path (`model.weights[i].path`, found from the
  variable being created, `keras_ps.creating_keras3_variable`), a tf-keras
  one by its name scope and name ("dense/kernel", its name without ":0");
- an optimizer slot (Keras creates it with `colocate_with` its variable)
  like its variable, when it has its variable's shape;
- anything else (metrics' totals, the optimizer's step) whole on every device.

Every layout chosen is recorded for `MeshStrategy.layout_report()`.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import tensorflow as tf
from tensorflow.experimental import dtensor

from tfdist import errors
from tfdist._internal import keras_ps
from tfdist._internal import single_replica
from tfdist.mesh import _dtensor
from tfdist.mesh import layouts as layouts_lib

__all__ = ["MeshExtended", "VariableLayout"]


@dataclasses.dataclass(frozen=True)
class VariableLayout:
    """One variable the scope created, as the layout report lists it.

    Attributes:
      path: Its Keras path (or TF name where Keras gives none).
      shape: Its whole shape.
      axes: The mesh axis each dimension is split over (None: whole).
      dtype_size: Bytes per element.
      slices: Into how many parts its elements are split (the product of its
        split axes' sizes); each device holds 1 / `slices` of it.
      reason: Which rule chose the layout.
    """

    path: str
    shape: tuple[int, ...]
    axes: layouts_lib.Axes
    dtype_size: int
    slices: int
    reason: str

    @property
    def bytes_per_device(self) -> int:
        """The bytes of this variable each device holds."""
        count = 1
        for extent in self.shape:
            count *= extent
        return count * self.dtype_size // self.slices


class MeshExtended(single_replica.SingleReplicaExtended):  # type: ignore[misc]
    """One replica spanning the mesh; see the module docstring.

    Args:
      container_strategy: The `tf.distribute.Strategy` this extends.
      mesh: DTensor's mesh.
      rules: Which layout each variable gets: the user's `layout_map`, or
        the automatic rules.
    """

    def __init__(
        self,
        container_strategy: tf.distribute.Strategy,
        *,
        mesh: dtensor.Mesh,
        rules: layouts_lib.LayoutRules | layouts_lib.AutomaticLayouts,
        batch_dim_name: str,
        is_chief: bool = True,
    ) -> None:
        super().__init__(container_strategy)
        self._is_chief = is_chief
        self.mesh = mesh
        self.rules = rules
        self.batch_dim_name = batch_dim_name
        self.created: list[VariableLayout] = []
        self._variables: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    @property
    def should_checkpoint(self) -> bool:
        """Whether this process writes checkpoints: on a cluster, worker 0 only.

        The others still save (elsewhere, then delete it, as
        `tfdist.elastic` and tf-keras's callbacks do): DTensor runs a save's
        reads on every worker's devices.
        """
        return self._is_chief

    def create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        del next_creator  # DTensor makes the variable: no plain tf.Variable is created.
        initial_value = kwargs["initial_value"]
        reference = kwargs.get("colocate_with")
        keras_variable = keras_ps.creating_keras3_variable()
        scope = tf.get_current_name_scope()  # tf-keras: the layer's; init_scope resets it.
        with tf.init_scope():
            value = initial_value() if callable(initial_value) else initial_value
            value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
            shape = tuple(int(s) for s in value.shape)
            name = kwargs.get("name") or "variable"
            path = getattr(keras_variable, "path", None) or (f"{scope}/{name}" if scope else name)
            if reference is not None and tuple(reference.shape) == shape:
                target = dtensor.fetch_layout(reference)
                axes = tuple(
                    None if spec == dtensor.UNSHARDED else spec for spec in target.sharding_specs
                )
                reason = "as the variable it is a slot of"
            else:
                axes = self.rules.axes_for(path, shape)
                target = _dtensor.layout(self.mesh, axes)
                reason = self.rules.explain(path)
            slices = 1
            for axis in axes:
                if axis is not None:
                    slices *= self.rules.mesh.axis_size(axis)
            self.created.append(
                VariableLayout(path, shape, axes, value.dtype.size, slices, reason)
            )
            variable = _dtensor.MeshVariable(
                _dtensor.to_mesh(value, target),
                trainable=kwargs.get("trainable", True),
                name=kwargs.get("name"),
            )
            self._variables[id(variable)] = variable
            return variable

    def replica_step(self) -> Any:
        """Each step is traced with writes forwarded to later reads (`_dtensor.forwarded_writes`)."""
        return _dtensor.forwarded_writes()

    def variable_created_in_scope(self, v: Any) -> bool:
        """Whether `v` was made by this strategy's scope (tf-keras checks every variable it is given)."""
        return self._variables.get(id(v)) is v

    def update_variable(self, var: Any, fn: Any, args: Any, kwargs: Any) -> Any:
        # DTensor places the update on the devices holding each slice.
        return fn(var, *(_laid_out_like(arg, var) for arg in args), **kwargs)

    @property
    def worker_devices(self) -> tuple[str, ...]:
        return tuple(self.rules.mesh.devices)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return tuple(self.rules.mesh.devices)


def _laid_out_like(value: Any, variable: Any) -> Any:
    """A gradient laid out as the variable it updates.

    A variable's gradient takes the layout of the activations it is made
    from: a whole Dense kernel fed by a column-parallel layer gets a
    gradient split by rows. TF's DTensor then computes an update of another
    layout than the variable's and writes it wrongly (seen: Adam steps 200x
    too large on such a kernel), so the gradient is relaid out first.
    """
    if isinstance(value, tf.Tensor) and value.shape == variable.shape:
        return dtensor.relayout(value, variable.layout)  # No-op where they agree.
    return value
