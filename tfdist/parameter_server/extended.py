"""The `StrategyExtended` behind `tfdist.ParameterServerStrategy`: where variables go.

TF's extended class (`tf.distribute.ParameterServerStrategy`'s, which Keras
and TF recognise) is subclassed in `tfdist/_internal/ps_runtime.py`, which
turns TF's private hooks into public ones; this class decides, through
them:

- a variable created inside `pinned_to_ps(i)` (or a Keras 3 variable pinned
  with `pin_variable`) goes whole to ps task i;
- an optimizer slot of a split variable is split the same way, each shard
  beside its variable's (TF would put the whole slot on one ps);
- any other variable goes where TF puts it (round robin over ps tasks, or
  split by the `variable_partitioner`), a split one's initial value drawn
  whole once so that it equals one device's (`_drawn_whole`);
- each `tf.Variable` made (each shard of a split one) passes through the
  strategy's `adopt` (its update gate), and Keras's hooks learn of each
  (Keras 3's counters made exact, split variables marked for
  checkpoints, tf-keras's layers listing a split variable whole);
- `update_variable` runs a split variable's update as it is (its ops go
  to each shard's ps).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, ContextManager

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist._internal import keras_layers
from tfdist._internal import keras_ps
from tfdist._internal import keras_sharded
from tfdist._internal import ps_runtime
from tfdist._internal import tf_keras_sharded

__all__ = ["MAX_WHOLE_INITIAL_BYTES", "ParameterServerExtended", "shards_of"]

#: TF's variable split over ps tasks (what a `variable_partitioner` makes).
ShardedVariable = ps_runtime.ShardedVariable


class ParameterServerExtended(ps_runtime.ParameterServerExtendedBase):  # type: ignore[misc]
    """Where the strategy's variables go, and how split ones are updated.

    Over TF's extended (`ps_runtime.ParameterServerExtendedBase`, whose
    public hooks this overrides): a variable goes whole to a pinned ps task
    (`pinned_to_ps`), split like the variable it is a slot of, or where TF's
    placement puts it (round robin, or split by the `variable_partitioner`,
    its initial value drawn whole once); every variable (each shard of a
    split one) passes through `adopt`; Keras's hooks learn of each.

    Args:
      *args, **kwargs: TF's (container strategy, cluster resolver,
        variable partitioner).
      adopt: Called as `adopt(variable, make_ledger)` with every
        `tf.Variable` the scope creates (each shard of a split one, before
        TF wraps it); returns the variable to use (see `_adopting`).
    """

    def __init__(
        self, *args: Any, adopt: Callable[..., Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._adopt = adopt
        self._pinned_index: int | None = None
        # Whether a partitioner may split variables (`whole_variables`
        # lifts it for a block; this does not change with it).
        self.splits_variables = self.variable_partitioner is not None
        self._tracks_tf_keras = self.splits_variables and tf_keras_sharded.in_use()

    def replica_step(self) -> ContextManager[Any]:
        # Keras 3 takes gradients of, and looks rows up in, split variables
        # only while `keras_sharded` is active: around each `strategy.run`.
        if not self.splits_variables:
            return contextlib.nullcontext()
        return keras_sharded.active()

    def create_variable(
        self, next_creator: Any, default: Callable[..., Any], **kwargs: Any
    ) -> Any:
        if self._adopt is not None:
            next_creator = _adopting(next_creator, self._adopt)
        keras3_variable = keras_ps.creating_keras3_variable()
        colocate_with = kwargs.get("colocate_with")
        pinned = keras_ps.pinned_ps(keras3_variable)
        if pinned is None:
            pinned = self._pinned_index
        if pinned is not None and colocate_with is None:
            # Whole, on the ps task asked for (`pinned_to_ps`).
            with tf.device(f"/job:ps/replica:0/task:{pinned}/device:CPU:0"):
                variable = self.variable_creator(next_creator, **kwargs)(**kwargs)
        elif isinstance(colocate_with, ShardedVariable) and _splits_like(kwargs, colocate_with):
            # A slot of a split variable (Keras 3's optimizers colocate them).
            variable = self._create_split_like(next_creator, colocate_with, **kwargs)
        else:
            variable = default(next_creator, **_drawn_whole(kwargs, self.variable_partitioner))
        # Workers update variables concurrently: Keras 3's read-modify-write
        # assign_add of the variable this is for would lose updates.
        keras_ps.make_counter_exact(keras3_variable)
        if keras3_variable is not None and isinstance(variable, ShardedVariable):
            keras_sharded.mark_split(keras3_variable)  # Checkpoints as its shards.
        if self._tracks_tf_keras:
            # tf-keras lists a split variable shard by shard: the layer it
            # is for, and every model built here, list it whole instead.
            owner = (
                tf_keras_sharded.creating_layer()
                if isinstance(variable, ShardedVariable)
                else tf_keras_sharded.creating_model(kwargs)
            )
            if owner is not None:
                tf_keras_sharded.track(owner)
        return variable

    def _create_split_like(self, next_creator: Any, like: Any, **kwargs: Any) -> Any:
        """A `ShardedVariable` with the shards of `like`: same rows, same ps tasks.

        TF creates a variable colocated with another whole, on one ps task;
        for the optimizer slots of a large split variable that would put the
        size of the whole table on one ps.
        """
        kwargs.pop("colocate_with")
        kwargs.pop("shape", None)
        initial_value = kwargs.pop("initial_value")
        name = kwargs.pop("name", None) or "split"
        var_creator = self.variable_creator(next_creator, **kwargs)
        shards = []
        # Eagerly, as TF's variable creation: slots may be made while a
        # tf.function traces its first call (a custom loop's first step).
        with tf.init_scope():
            value = initial_value() if callable(initial_value) else initial_value
            value = tf.convert_to_tensor(value, dtype=kwargs.get("dtype"))
            parts = tf.split(value, [int(shard.shape[0]) for shard in like.variables], axis=0)
            for index, (shard, part) in enumerate(zip(like.variables, parts)):
                with tf.device(shard.device):
                    shards.append(
                        var_creator(initial_value=part, name=f"{name}/part_{index}", **kwargs)
                    )
        return ShardedVariable(shards, name=name)

    def update_variable(
        self, var: Any, fn: Any, args: Any, kwargs: Any, group: bool, *, default: Any
    ) -> Any:
        """Updates `var`; a split variable's update runs as is (its ops go to each shard's ps).

        TF's update colocates with the variable, which a `ShardedVariable`
        (Keras 3's optimizers pass it) refuses.
        """
        if isinstance(var, ShardedVariable) or keras_sharded.sharded_value(var) is not None:
            return fn(var, *self.single_value(args), **self.single_value(kwargs))
        return default()

    @contextlib.contextmanager
    def pinned_to_ps(self, index: int) -> Iterator[None]:
        """Variables created inside go whole on ps task `index` (a layer's own shards).

        A Keras 3 variable whose creation Keras defers past this block is
        pinned by `pin_variable` instead. Optimizer slots
        made later, colocated with such a variable, follow it. For the
        chief's thread that creates variables.
        """
        if not 0 <= index < self.num_ps:
            raise errors.ConfigError(
                f"ps task {index} does not exist: the cluster has {self.num_ps} ps "
                f"task(s); received index={index!r}. Pass an index in [0, {self.num_ps})."
            )
        previous, self._pinned_index = self._pinned_index, index
        try:
            yield
        finally:
            self._pinned_index = previous

    def pin_variable(self, variable: Any, index: int) -> None:
        """Pins a Keras 3 variable not created yet (Keras defers it) to ps task `index`."""
        keras_ps.pin_to_ps(variable, index)

    @contextlib.contextmanager
    def whole_variables(self) -> Iterator[None]:
        """Variables created inside are not split by the `variable_partitioner`.

        For the chief's thread that creates variables (variable creation in
        a strategy's scope is not thread-safe anyway).
        """
        with self.partitioner_lifted():
            yield


def shards_of(variable: Any) -> list[Any]:
    """The `tf.Variable`s storing `variable` (a Keras 3 or tf-keras weight): its shards in row order, or itself."""
    value = keras_layers.storage_variable(variable)
    if isinstance(value, ShardedVariable):
        return list(value.variables)
    return [value]


#: Largest variable whose initial value is drawn whole on the chief and then
#: split (`_drawn_whole`): each shard of it travels to its ps in one message,
#: and TF's messages stop at 2 GB.
MAX_WHOLE_INITIAL_BYTES = 1 << 30


def _drawn_whole(kwargs: dict[str, Any], partitioner: Any) -> dict[str, Any]:
    """`kwargs` whose callable initial value TF's split path draws whole, once.

    TF asks a callable initial value for each shard's rows
    (`partition_shape=`, `partition_offset=`), and tf-keras's random
    initializers then draw each shard on their own: values other than those
    one device draws for the whole variable with the same seed (Keras 3
    passes the whole value). The callable returned refuses those arguments,
    so TF calls it without them and slices; it draws the whole value for the
    first shard and hands the same tensor to the others. Left alone: a value
    that is not callable; a checkpoint's (`shard_info`: restored per shard);
    a variable `partitioner` does not split; one of unknown size or over
    `MAX_WHOLE_INITIAL_BYTES` (drawn per shard as TF does, with a warning
    that it differs from one device).
    """
    initial_value = kwargs.get("initial_value")
    shape, dtype = kwargs.get("shape"), kwargs.get("dtype")
    if not callable(initial_value) or shape is None or dtype is None:
        return kwargs
    if ps_runtime.takes_argument(initial_value, "shard_info"):
        return kwargs
    shape = tf.TensorShape(shape)
    if partitioner is None or not shape.is_fully_defined() or not shape.rank:
        return kwargs
    if min(partitioner(shape=shape, dtype=tf.as_dtype(dtype))[0], shape[0]) <= 1:
        return kwargs
    num_bytes = shape.num_elements() * tf.as_dtype(dtype).size
    if num_bytes > MAX_WHOLE_INITIAL_BYTES:
        logging.warning(
            "Variable %s (%d bytes) is split over the ps tasks with each shard's rows "
            "drawn on their own: its initial values differ from those one device "
            "draws with the same seed. Pass the initial values (a checkpoint, "
            "set_weights) where they must be equal.", kwargs.get("name"), num_bytes)
        return kwargs
    drawn: list[Any] = []

    def whole() -> Any:
        if not drawn:
            with tf.init_scope():
                drawn.append(tf.convert_to_tensor(initial_value(), dtype=dtype))
        return drawn[0]

    return {**kwargs, "initial_value": whole}


def _adopting(next_creator: Any, adopt: Callable[..., Any]) -> Any:
    """`next_creator` whose variables (each shard of a split one) pass through `adopt`.

    `adopt(variable, make_ledger)`: `make_ledger(size)` makes an int64
    vector of zeros on the variable's device with the same creator (below
    the strategy's: a plain variable, not placed, wrapped or tracked by it).
    """

    def create(**kwargs: Any) -> Any:
        variable = next_creator(**kwargs)

        def make_ledger(size: int) -> Any:
            with tf.device(variable.device):
                return next_creator(
                    initial_value=lambda: tf.zeros([size], tf.int64),
                    trainable=False,
                    dtype=tf.int64,
                    name="tfdist_update_ledger",
                )

        return adopt(variable, make_ledger)

    return create


def _splits_like(kwargs: dict[str, Any], like: Any) -> bool:
    """Whether a variable colocated with split `like` can take its shards (same rows).

    Keras's slots can; one of another shape, or with no initial value (a
    SavedModel being loaded), is left to TF (whole, on one ps task).
    """
    if kwargs.get("initial_value") is None:
        return False
    shape = kwargs.get("shape")
    if shape is None and isinstance(kwargs["initial_value"], tf.Tensor):
        shape = kwargs["initial_value"].shape
    if shape is None:
        return True  # A callable (Keras's initializer) of the reference's shape.
    shape = tf.TensorShape(shape)
    return bool(shape.rank) and shape[0] == like.shape[0]
