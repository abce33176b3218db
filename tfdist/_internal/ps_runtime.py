"""TF's parameter-server runtime, as tfdist's strategy drives it (TF private).

`tfdist.ParameterServerStrategy` subclasses TF's
`tf.distribute.ParameterServerStrategy` (Keras and TF recognise that class)
but builds it with tfdist's `StrategyExtended` subclass, keeps Keras off
TF's ClusterCoordinator path (tfdist schedules Keras's steps itself), and
schedules Python closures (which run in the coordinator's thread for a
worker and call the compiled step) rather than only `tf.function`s.

Private TF API used (tested range: see setup.py):

- `parameter_server_strategy_v2.ParameterServerStrategyV2Extended`: the
  class to subclass; its `_create_variable` (variable creation, for
  tfdist's partitioning) and, through `update_hook`, `_update`;
- the body of `ParameterServerStrategyV2.__init__`: `_verify_args_and_config`,
  `_connect_to_cluster`, and the attributes it sets
  (`_cluster_resolver`, `_cluster_coordinator`, `_extended`,
  `_should_use_with_coordinator`, `_canonicalize_devices`,
  `_is_parameter_server_strategy_v2`);
- `ParameterServerStrategyV2Extended._allow_run_without_coordinator`,
  `_create_variable_round_robin`, `_num_ps`;
- `ClusterCoordinator._cluster.schedule` (schedules a Python function,
  which the public `schedule` refuses) and
  `_cluster.closure_queue.wait` (`join` with a timeout) and its
  `_error` (the pending error of a scheduled function);
- `cluster_coordinator.PSUnavailableError`: TF's error for a lost ps;
- `sharded_variable.ShardedVariable`: the class of a partitioned variable;
- `util.tf_inspect.getfullargspec`: how TF's split path tells a checkpoint's
  initial value (`shard_info`) from an initializer's, asked the same way;
- `cluster_coordinator._select_worker_slice` and `_maybe_as_type_spec`:
  the spec a function traced on the chief takes for a per-worker iterator;
- `coordinator_context.get_current_dispatch_context`: which worker's
  thread runs the current closure (TF's public accessor works only while
  tracing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from absl import logging
from tensorflow.python.distribute import parameter_server_strategy_v2 as _ps_v2
from tensorflow.python.distribute import sharded_variable as _sharded_variable
from tensorflow.python.util import tf_inspect
from tensorflow.python.distribute.coordinator import (
    cluster_coordinator as _cluster_coordinator,
)
from tensorflow.python.distribute.coordinator import (
    coordinator_context as _coordinator_context,
)

from tfdist import errors
from tfdist._internal import attributes
from tfdist._internal import keras_layers
from tfdist._internal import keras_ps
from tfdist._internal import keras_sharded
from tfdist._internal import tf_keras_sharded
from tfdist._internal import update_hook

__all__ = [
    "PSUnavailableError",
    "ParameterServerExtended",
    "ShardedVariable",
    "current_worker_index",
    "initialize_strategy",
    "pending_error",
    "schedule_python",
    "server_config",
    "wait_idle",
    "worker_value_spec",
]

#: TF's variable split over ps tasks (what a `variable_partitioner` makes).
ShardedVariable = _sharded_variable.ShardedVariable
#: TF's error for a ps task that became unreachable (a `tf.errors.UnavailableError`).
PSUnavailableError = _cluster_coordinator.PSUnavailableError


class ParameterServerExtended(  # type: ignore[misc]
    update_hook.UpdateHook, _ps_v2.ParameterServerStrategyV2Extended
):
    """TF's ParameterServerStrategyV2Extended with public hooks tfdist overrides.

    `create_variable(next_creator, default, **kwargs)` decides where each
    variable goes (`default()` is TF's placement: round robin over ps
    tasks, or TF's `variable_partitioner`), and `update_variable(var, fn,
    args, kwargs, group, default)` (`update_hook.UpdateHook`) runs
    `fn(var, *args, **kwargs)` for `StrategyExtended.update` (how Keras's
    optimizers apply gradients).

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
        # Whether a partitioner may split variables (`whole_variables`
        # lifts it for a block; this does not change with it).
        self.splits_variables = self._variable_partitioner is not None
        self._tracks_tf_keras = self.splits_variables and tf_keras_sharded.in_use()

    def _call_for_each_replica(self, fn: Any, args: Any, kwargs: Any) -> Any:
        # Keras 3 takes gradients of, and looks rows up in, split variables
        # only while `keras_sharded` is active: around each `strategy.run`.
        if not self.splits_variables:
            return super()._call_for_each_replica(fn, args, kwargs)
        with keras_sharded.active():
            return super()._call_for_each_replica(fn, args, kwargs)

    def _create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        if self._adopt is not None:
            next_creator = _adopting(next_creator, self._adopt)
        keras3_variable = keras_ps.creating_keras3_variable()
        colocate_with = kwargs.get("colocate_with")
        pinned = getattr(keras3_variable, "_tfdist_pinned_ps", None)
        if pinned is None:
            pinned = getattr(self, "_pinned_ps", None)
        if pinned is not None and colocate_with is None:
            # Whole, on the ps task asked for (`pinned_to_ps`).
            with tf.device(f"/job:ps/replica:0/task:{pinned}/device:CPU:0"):
                variable = self._create_var_creator(next_creator, **kwargs)(**kwargs)
        elif isinstance(colocate_with, ShardedVariable) and _splits_like(kwargs, colocate_with):
            # A slot of a split variable (Keras 3's optimizers colocate them).
            variable = self._create_split_like(next_creator, colocate_with, **kwargs)
        else:
            kwargs = _drawn_whole(kwargs, self._variable_partitioner)
            variable = self.create_variable(
                next_creator,
                lambda **overrides: super(ParameterServerExtended, self)._create_variable(
                    next_creator, **{**kwargs, **overrides}
                ),
                **kwargs,
            )
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
        var_creator = self._create_var_creator(next_creator, **kwargs)
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
            return fn(var, *self._select_single_value(args), **self._select_single_value(kwargs))
        return default()

    @contextlib.contextmanager
    def pinned_to_ps(self, index: int) -> Iterator[None]:
        """Variables created inside go whole on ps task `index` (a layer's own shards).

        A Keras 3 variable whose creation Keras defers past this block is
        pinned by its `_tfdist_pinned_ps` attribute instead. Optimizer slots
        made later, colocated with such a variable, follow it. For the
        chief's thread that creates variables.
        """
        if not 0 <= index < self.num_ps:
            raise errors.ConfigError(
                f"ps task {index} does not exist: the cluster has {self.num_ps} ps "
                f"task(s); received index={index!r}. Pass an index in [0, {self.num_ps})."
            )
        with attributes.swapped(self, "_pinned_ps", index):
            yield

    def pin_variable(self, variable: Any, index: int) -> None:
        """Pins a Keras 3 variable not created yet (Keras defers it) to ps task `index`."""
        variable._tfdist_pinned_ps = index

    @contextlib.contextmanager
    def whole_variables(self) -> Iterator[None]:
        """Variables created inside are not split by the `variable_partitioner`.

        For the chief's thread that creates variables (variable creation in
        a strategy's scope is not thread-safe anyway).
        """
        with attributes.swapped(self, "_variable_partitioner", None):
            yield

    def create_variable(self, next_creator: Any, default: Callable[..., Any], **kwargs: Any) -> Any:
        """Creates one variable; by default as TF does."""
        del next_creator, kwargs
        return default()

    @property
    def num_ps(self) -> int:
        """The ps tasks variables are placed on."""
        return int(self._num_ps)


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
    spec = tf_inspect.getfullargspec(initial_value)
    if "shard_info" in spec.args or "shard_info" in spec.kwonlyargs:
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


def initialize_strategy(
    strategy: Any,
    resolver: tf.distribute.cluster_resolver.ClusterResolver,
    make_extended: Callable[[], ParameterServerExtended],
) -> None:
    """Runs the body of TF's `ParameterServerStrategyV2.__init__` with tfdist's extended.

    Connects this process (the chief) to the cluster: blocks until TF's
    runtime reaches every task. Then keeps Keras (tf-keras) off TF's
    ClusterCoordinator path: tfdist schedules Keras's steps itself, and
    allows `strategy.run` in functions tfdist schedules.

    Args:
      strategy: The `tf.distribute.ParameterServerStrategy` being built.
      resolver: Its cluster, with the chief as this task.
      make_extended: Builds the extended once the cluster is connected
        (TF's extended counts the workers' devices).
    """
    strategy._cluster_resolver = resolver
    strategy._verify_args_and_config(resolver)
    strategy._cluster_coordinator = None
    strategy._connect_to_cluster(coordinator_name="chief")
    extended = make_extended()
    strategy._extended = extended
    tf.distribute.Strategy.__init__(strategy, extended)
    # tf-keras schedules through TF's ClusterCoordinator when this is True
    # (and then needs repeat() and steps_per_epoch); tfdist does it instead.
    strategy._should_use_with_coordinator = False
    strategy._canonicalize_devices = False
    strategy._is_parameter_server_strategy_v2 = True
    extended._allow_run_without_coordinator = True


def schedule_python(
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
    function: Callable[..., Any],
    args: tuple[Any, ...],
) -> Any:
    """Queues `function(*args)` for the next free worker; returns its RemoteValue.

    `function` is plain Python: it runs in the coordinator's thread for the
    worker that takes it, under that worker's device scope, so the compiled
    functions it calls run on the worker. If it raises an error TF counts
    as a worker failure, TF queues it again for another worker.
    """
    with coordinator.strategy.scope():
        return coordinator._cluster.schedule(function, args=args, kwargs=None)


def worker_value_spec(value: Any) -> Any:
    """What a function traced on the chief takes for a per-worker value (TF's own closures do this).

    For `iter(coordinator.create_per_worker_dataset(...))`, the spec of one
    worker's iterator; a function traced with it runs on any worker, with
    that worker's iterator. Other values are returned as they are.
    """
    return _cluster_coordinator._maybe_as_type_spec(
        _cluster_coordinator._select_worker_slice(0, value)
    )


def current_worker_index() -> int:
    """The index of the worker whose coordinator thread runs this closure."""
    context = _coordinator_context.get_current_dispatch_context()
    if context is None:
        raise RuntimeError("not in a closure scheduled by a ClusterCoordinator")
    return int(context.worker_index)


def pending_error(
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
) -> BaseException | None:
    """The error a scheduled function raised, if any, without raising it.

    TF's `join`/`done` raise it only after every running function has
    finished (they cancel the queue first), which a stuck worker never
    does; tfdist reads it and raises its own error without waiting.
    """
    error: BaseException | None = coordinator._cluster.closure_queue._error
    return error


def wait_idle(
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
    timeout_s: float,
) -> bool:
    """Waits up to `timeout_s` for the queue to drain; False if it did not.

    Raises the error of a failed scheduled function, as `join` does.
    """
    return bool(coordinator._cluster.closure_queue.wait(timeout=timeout_s))


def server_config(inter_op_threads: int) -> tf.compat.v1.ConfigProto:
    """The session config of a worker or ps server: enough inter-op threads.

    Every RPC a ps or worker serves for a peer holds one inter-op thread
    while it waits for that peer; with fewer threads than peers + 1, every
    thread can be waiting and the cluster deadlocks (TF sizes the pool from
    the core count: 2 on a 2-core machine).
    """
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = inter_op_threads
    return config
