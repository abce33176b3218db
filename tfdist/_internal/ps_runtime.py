"""TF's parameter-server runtime, as tfdist's strategy drives it (TF private).

`tfdist.ParameterServerStrategy` subclasses TF's
`tf.distribute.ParameterServerStrategy` (Keras and TF recognise that class)
but builds it with tfdist's `StrategyExtended` subclass
(`tfdist/parameter_server/extended.py`, over `ParameterServerExtendedBase`
here), keeps Keras off TF's ClusterCoordinator path (tfdist schedules
Keras's steps itself), and schedules Python closures (which run in the
coordinator's thread for a worker and call the compiled step) rather than
only `tf.function`s. This module holds only the adapters over TF's private
names; what tfdist decides lives in the family package.

Private TF API used (tested range: see setup.py):

- `parameter_server_strategy_v2.ParameterServerStrategyV2Extended`: the
  class to subclass; its `_create_variable` (variable creation),
  `_call_for_each_replica` (a replica call of `strategy.run`) and, through
  `update_hook`, `_update`; its `_variable_partitioner`, `_num_ps`,
  `_create_var_creator` and `_select_single_value`;
- the body of `ParameterServerStrategyV2.__init__`: `_verify_args_and_config`,
  `_connect_to_cluster`, and the attributes it sets
  (`_cluster_resolver`, `_cluster_coordinator`, `_extended`,
  `_should_use_with_coordinator`, `_canonicalize_devices`,
  `_is_parameter_server_strategy_v2`);
- `ParameterServerStrategyV2Extended._allow_run_without_coordinator`;
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
from typing import Any, ContextManager

import tensorflow as tf
from tensorflow.python.distribute import parameter_server_strategy_v2 as _ps_v2
from tensorflow.python.distribute import sharded_variable as _sharded_variable
from tensorflow.python.util import tf_inspect
from tensorflow.python.distribute.coordinator import (
    cluster_coordinator as _cluster_coordinator,
)
from tensorflow.python.distribute.coordinator import (
    coordinator_context as _coordinator_context,
)

from tfdist._internal import attributes
from tfdist._internal import update_hook

__all__ = [
    "PSUnavailableError",
    "ParameterServerExtendedBase",
    "ShardedVariable",
    "current_worker_index",
    "initialize_strategy",
    "pending_error",
    "schedule_python",
    "server_config",
    "takes_argument",
    "wait_idle",
    "worker_value_spec",
]

#: TF's variable split over ps tasks (what a `variable_partitioner` makes).
ShardedVariable = _sharded_variable.ShardedVariable
#: TF's error for a ps task that became unreachable (a `tf.errors.UnavailableError`).
PSUnavailableError = _cluster_coordinator.PSUnavailableError


class ParameterServerExtendedBase(  # type: ignore[misc]
    update_hook.UpdateHook, _ps_v2.ParameterServerStrategyV2Extended
):
    """TF's ParameterServerStrategyV2Extended with public hooks a tfdist subclass overrides.

    - `create_variable(next_creator, default, **kwargs)` creates each
      variable of the scope; `default(next_creator, **kwargs)` is TF's
      placement (round robin over ps tasks, or TF's `variable_partitioner`).
    - `update_variable(var, fn, args, kwargs, group, default)`
      (`update_hook.UpdateHook`) runs `fn(var, *args, **kwargs)` for
      `StrategyExtended.update` (how Keras's optimizers apply gradients).
    - `replica_step()` is the context each `strategy.run` replica call runs in.

    Args:
      *args, **kwargs: TF's (container strategy, cluster resolver,
        variable partitioner).
    """

    def create_variable(
        self, next_creator: Any, default: Callable[..., Any], **kwargs: Any
    ) -> Any:
        """Creates one variable; by default as TF does."""
        return default(next_creator, **kwargs)

    def replica_step(self) -> ContextManager[Any]:
        """The context each replica call of `strategy.run` runs in; none by default."""
        return contextlib.nullcontext()

    @property
    def variable_partitioner(self) -> Any:
        """TF's `variable_partitioner` of the strategy (None while lifted)."""
        return self._variable_partitioner

    @contextlib.contextmanager
    def partitioner_lifted(self) -> Iterator[None]:
        """Inside, TF's placement splits no variable (for the thread that creates them)."""
        with attributes.swapped(self, "_variable_partitioner", None):
            yield

    @property
    def num_ps(self) -> int:
        """The ps tasks variables are placed on."""
        return int(self._num_ps)

    def variable_creator(self, next_creator: Any, **kwargs: Any) -> Callable[..., Any]:
        """TF's creator of one variable on the current device (below its placement)."""
        return self._create_var_creator(next_creator, **kwargs)

    def single_value(self, structure: Any) -> Any:
        """`structure` with TF's per-replica values replaced by their one component."""
        return self._select_single_value(structure)

    # TF's StrategyExtended hooks.

    def _create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        return self.create_variable(
            next_creator,
            lambda creator, **kw: super(ParameterServerExtendedBase, self)._create_variable(
                creator, **kw
            ),
            **kwargs,
        )

    def _call_for_each_replica(self, fn: Any, args: Any, kwargs: Any) -> Any:
        with self.replica_step():
            return super()._call_for_each_replica(fn, args, kwargs)


def takes_argument(function: Any, name: str) -> bool:
    """Whether `function` takes an argument `name`, asked as TF's variable split asks."""
    spec = tf_inspect.getfullargspec(function)
    return name in spec.args or name in spec.kwonlyargs


def initialize_strategy(
    strategy: Any,
    resolver: tf.distribute.cluster_resolver.ClusterResolver,
    make_extended: Callable[[], ParameterServerExtendedBase],
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
