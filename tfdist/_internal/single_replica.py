"""TF's strategy contract for a strategy of one replica, behind public hooks (TF private).

TF's `Strategy.run` calls `extended.call_for_each_replica`, which only the
V1 `tf.compat.v1.distribute.StrategyExtended` defines; the underscore
methods of that class are TF's real strategy contract. `SingleReplicaExtended`
implements them for one replica whose variables and ops a subclass places,
and exposes what a subclass decides through public names:

- `create_variable(next_creator, **kwargs)`: every variable the scope
  creates (`colocate_with` among the kwargs for an optimizer slot);
- `replica_step()`: the context every replica step (`strategy.run`) runs
  in, entered inside TF's replica context;
- `update_variable(var, fn, args, kwargs)`: how `StrategyExtended.update`
  (Keras's optimizers apply every gradient through it) runs `fn(var,
  *args, **kwargs)`; by default on the variable's own device;
- `container_strategy()`: the `tf.distribute.Strategy` this extends.

Reductions, gathers and broadcasts of one replica return the value itself.

Private TF API used (tested range: see setup.py): the `StrategyExtended`
underscore hooks; `distribute_lib.UpdateContext` and
`distribute_utils.select_replica` (through `mirrored_extended`).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import tensorflow as tf

from tfdist._internal import mirrored_extended

__all__ = ["SingleReplicaExtended"]


class SingleReplicaExtended(tf.compat.v1.distribute.StrategyExtended):  # type: ignore[misc]
    """One replica; a subclass places its variables and ops (module docstring)."""

    def container_strategy(self) -> tf.distribute.Strategy:
        """The strategy this extends."""
        return self._container_strategy()

    def create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        """Creates one variable of the scope; by default where TF would."""
        return next_creator(**kwargs)

    def replica_step(self) -> ContextManager[Any]:
        """The context each replica step runs in; none by default."""
        return contextlib.nullcontext()

    def update_variable(self, var: Any, fn: Any, args: Any, kwargs: Any) -> Any:
        """Runs `fn(var, *args, **kwargs)` for `update`; by default on `var`'s device."""
        with tf.device(var.device):
            return fn(var, *args, **kwargs)

    # ------------------------------------------------------------------
    # TF's StrategyExtended hooks.

    def _create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        return self.create_variable(next_creator, **kwargs)

    def _call_for_each_replica(self, fn: Any, args: Any, kwargs: Any) -> Any:
        args = mirrored_extended.select_replica(0, args)
        kwargs = mirrored_extended.select_replica(0, kwargs or {})
        with self.replica_step(), tf.distribute.ReplicaContext(
            self._container_strategy(), replica_id_in_sync_group=0
        ):
            return fn(*args, **kwargs)

    def _experimental_distribute_values_from_function(self, value_fn: Any) -> Any:
        return value_fn(tf.distribute.experimental.ValueContext())

    def _reduce_to(self, reduce_op: Any, value: Any, destinations: Any, options: Any) -> Any:
        del reduce_op, destinations, options  # One replica: the value itself.
        return mirrored_extended.select_replica(0, value)

    def _gather_to_implementation(
        self, value: Any, destinations: Any, axis: Any, options: Any
    ) -> Any:
        del destinations, axis, options
        return mirrored_extended.select_replica(0, value)

    def _broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        del destinations
        return tensor

    def _update(self, var: Any, fn: Any, args: Any, kwargs: Any, group: bool) -> Any:
        # Keras's optimizers apply every gradient through here.
        with mirrored_extended.update_context(0):
            result = self.update_variable(
                var,
                fn,
                mirrored_extended.select_replica(0, args),
                mirrored_extended.select_replica(0, kwargs or {}),
            )
        return result if group else tf.nest.map_structure(lambda x: (x,), result)

    def _update_non_slot(
        self, colocate_with: Any, fn: Any, args: Any, kwargs: Any, group: bool
    ) -> Any:
        del colocate_with
        with mirrored_extended.update_context(0):
            result = fn(*args, **(kwargs or {}))
        return result if group else tf.nest.map_structure(lambda x: (x,), result)

    def read_var(self, var: Any) -> Any:
        return tf.identity(var)

    def value_container(self, value: Any) -> Any:
        return value

    def _local_results(self, value: Any) -> tuple[Any, ...]:
        return (value,)

    @property
    def _num_replicas_in_sync(self) -> int:
        return 1

    def _get_local_replica_id(self, replica_id_in_sync_group: int) -> int:
        return replica_id_in_sync_group

    def _in_multi_worker_mode(self) -> bool:
        return False

    @property
    def experimental_between_graph(self) -> bool:
        return False

    @property
    def experimental_should_init(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        return True

    @property
    def should_save_summary(self) -> bool:
        return True
