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
- `eager.context` coordination and collective-health calls: TF's
  MultiWorkerMirroredStrategy configures the coordination service itself
  with no timeouts (a worker that never starts is waited for forever);
  tfdist configures it first, with `timeout_s`-derived bounds, and its peer
  watchdog probes peers and aborts collectives as TF's own (disabled)
  health-check thread would.
- `coordination_config_pb2.CoordinatedJob`: the job list of that config.
- `input_util.get_distributed_datasets_from_function` and MWMS's
  `_input_workers_with_options` / `_make_input_context`: tfdist reads a
  CPU worker's input with a plain iterator (no `MultiDeviceIterator`, whose
  GeneratorDatasets make TF lower glibc's trim threshold for the whole
  process), as `InputReplicationMode.PER_REPLICA` does; TF's MWMS refuses
  that mode in its public method although its input path supports it for
  one local replica.
- `cross_device_ops.CollectiveAllReduce` and its `CollectiveReplicaLauncher`:
  tfdist's cross-worker all-reduce subclasses TF's multi-worker cross-device
  ops (everything but gradient aggregation stays TF's) and launches its
  cross-worker collectives through TF's launcher (group and instance keys,
  ordering tokens), the same engine MWMS uses.
- `CollectiveReplicaLauncher.all_reduce` / `_all_gather`, wrapped per
  launcher instance (`watch_collectives`): every collective of training
  (gradients, metrics, gathers, input `has_value` checks) is created
  there, so tfdist brackets each with the started/finished counters its
  watchdog reads, instead of TF's per-op `timeout`, which starts two
  threads per collective that sleep for the whole timeout. (The one-time
  broadcast of initial variable values calls TF's collective ops directly
  and, as in TF, has no bound but the lost-peer probes.)
- `errors_impl._CODE_TO_EXCEPTION_CLASS` and
  `atomic_function.InterpolateRuntimeError.__exit__`: after the watchdog
  declares a peer lost (or a collective overdue), TF's UNAVAILABLE (or
  DEADLINE_EXCEEDED) errors (the aborted collectives, raised from C++
  inside `fit`, where no tfdist code runs) become a tfdist subclass of
  TF's error class, so `fit` raises a tfdist error. Eager ops build errors
  from the first; `tf.function` calls get theirs from TF's C++ registry,
  which cannot be re-initialized, and pass them through the second, where
  the instance is re-classed (and where a failed call tells the watchdog's
  counters, `on_function_error`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as _cross_device_ops
from tensorflow.python.distribute import distribute_lib as _distribute_lib
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import input_util as _input_util
from tensorflow.python.distribute import mirrored_strategy as _mirrored_strategy
from tensorflow.python.distribute import values as _values
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as _coordination_pb2
from tensorflow.python.eager import context as _context
from tensorflow.python.eager.polymorphic_function import atomic_function as _atomic_function
from tensorflow.python.framework import errors_impl as _errors_impl
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops

__all__ = [
    "MirroredExtended",
    "destination_devices",
    "distribute_datasets_read_on_host",
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


#: Every replica's input pipeline read on the host by a plain iterator.
_READ_ON_HOST = tf.distribute.InputOptions(
    experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    experimental_fetch_to_device=False,
)


def distribute_datasets_read_on_host(strategy: Any, dataset_fn: Any) -> Any:
    """`distribute_datasets_from_function` with one host pipeline per replica.

    For a MirroredStrategy this is the public `PER_REPLICA` option without
    fetching to devices. For a MultiWorkerMirroredStrategy (whose public
    method rejects that option) the same TF input path is called directly;
    the caller must ensure the worker has exactly one local replica.
    """
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        extended = strategy.extended
        return _input_util.get_distributed_datasets_from_function(
            dataset_fn=dataset_fn,
            input_workers=extended._input_workers_with_options(_READ_ON_HOST),
            input_contexts=[extended._make_input_context()],
            strategy=strategy,
            options=_READ_ON_HOST,
        )
    return strategy.distribute_datasets_from_function(dataset_fn, _READ_ON_HOST)


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


def configure_coordination_service(
    jobs: Sequence[tuple[str, int]],
    leader: str,
    *,
    register_timeout_ms: int,
    heartbeat_timeout_ms: int,
    shutdown_barrier_timeout_ms: int,
) -> None:
    """Configures TF's coordination service as MWMS does, with timeouts.

    Must run before the TF context is initialized (before the strategy is
    built); TF's MultiWorkerMirroredStrategy then keeps this configuration.

    Args:
      jobs: (job name, task count) of the coordinated jobs (chief, worker).
      leader: The service leader, e.g. "/job:chief/replica:0/task:0".
      register_timeout_ms: Bound on waiting for every task to register.
      heartbeat_timeout_ms: A task silent this long is declared dead.
      shutdown_barrier_timeout_ms: Bound on the shutdown barrier at exit.
    """
    _context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=leader,
        cluster_register_timeout_in_ms=register_timeout_ms,
        heartbeat_timeout_in_ms=heartbeat_timeout_ms,
        shutdown_barrier_timeout_in_ms=shutdown_barrier_timeout_ms,
        coordinated_jobs=[
            _coordination_pb2.CoordinatedJob(name=name, num_tasks=count)
            for name, count in jobs
        ],
    )
    # Without the barrier, the register timeout does not end the wait for a
    # task that never connects (TF 2.21).
    _context.context()._coordination_service_config.cluster_register_with_barrier = True


def check_peer_health(peer: str, timeout_ms: int) -> None:
    """Raises a `tf.errors.OpError` if collective peer `peer` is not healthy.

    `peer` is "/job:worker/replica:0/task:1"; a restarted peer is unhealthy.
    """
    _context.context().check_collective_ops_peer_health(peer, timeout_ms)


def abort_collectives(message: str, code: int = tf.errors.UNAVAILABLE) -> None:
    """Makes every pending and later collective fail with error `code`."""
    _context.context().abort_collective_ops(code, message)


def set_cluster_key(key: str, value: str) -> None:
    """Stores `key` in the coordination service's key-value store."""
    _context.context().set_config_key_value(key, value)


def get_cluster_key(key: str, timeout_ms: int) -> str | None:
    """Returns `key` from the coordination service, or None if unset in time."""
    try:
        return str(_context.context().get_config_key_value(key, timeout_ms))
    except (tf.errors.DeadlineExceededError, tf.errors.NotFoundError,
            tf.errors.UnavailableError):
        return None


#: (TF's class, tfdist's subclass) pairs, by TF error code.
_error_classes: dict[int, tuple[type[tf.errors.OpError], type[tf.errors.OpError]]] = {}


def install_error_class_hook() -> None:
    """Lets `raise_errors_as` reach `tf.function` calls.

    Must run before the calls it should affect start: Python binds a `with`
    block's `__exit__` when the block is entered, and `fit` may already be
    waiting inside a call when the error class is chosen. Idempotent.
    """
    interpolate = _atomic_function.InterpolateRuntimeError
    if getattr(interpolate, "_tfdist_original_exit", None) is not None:
        return
    original_exit = interpolate.__exit__

    def exit_with_error_class(self: Any, typ: Any, exc: Any, tb: Any) -> Any:
        pair = _error_classes.get(getattr(exc, "error_code", None))  # type: ignore[arg-type]
        if pair is not None and type(exc) is pair[0]:
            exc.__class__ = pair[1]
        if exc is not None:
            for callback in list(_function_error_callbacks):
                callback()
        return original_exit(self, typ, exc, tb)

    interpolate._tfdist_original_exit = original_exit
    interpolate.__exit__ = exit_with_error_class


#: Called after any `tf.function` call raises (see `on_function_error`).
_function_error_callbacks: list[Callable[[], None]] = []


def on_function_error(callback: Callable[[], None]) -> Callable[[], None]:
    """Calls `callback()` each time a `tf.function` call raises.

    Needs `install_error_class_hook`; runs in the thread that made the call,
    before the error reaches its caller. Returns a function that removes
    `callback`.
    """
    _function_error_callbacks.append(callback)
    return lambda: _function_error_callbacks.remove(callback)


def raise_errors_as(code: int, error_class: type[tf.errors.OpError]) -> None:
    """Makes every later TF error with `code` an instance of `error_class`.

    `error_class` must subclass TF's class for `code` (for example
    `tf.errors.UnavailableError` for `tf.errors.UNAVAILABLE`), add no
    instance layout, and take its constructor arguments. Covers eager ops
    and, after `install_error_class_hook`, `tf.function` calls (as in
    `model.fit`); see the module docstring.
    """
    tf_class = _error_classes.get(code, (_errors_impl._CODE_TO_EXCEPTION_CLASS[code],))[0]
    _errors_impl._CODE_TO_EXCEPTION_CLASS[code] = error_class
    _error_classes[code] = (tf_class, error_class)


#: TF's multi-worker cross-device ops (MultiWorkerMirroredStrategy's).
CollectiveAllReduce = _cross_device_ops.CollectiveAllReduce


def collective_all_reduce(ops: Any, tensor: tf.Tensor, options: Any) -> tf.Tensor:
    """SUM of `tensor` over the group of `ops` (a one-device CollectiveAllReduce)."""
    return ops._launchers[0].all_reduce(tensor, None, options)


def collective_all_gather(ops: Any, tensor: tf.Tensor, options: Any) -> tf.Tensor:
    """Concatenation along axis 0 of `tensor` from every member of `ops`' group."""
    return ops._launchers[0]._all_gather(tensor, options)


def host_collective_ops(extended: Any) -> Any:
    """MWMS's `CollectiveAllReduce` for values on the host (e.g. metrics)."""
    return extended._host_cross_device_ops


def watch_collectives(
    collective_ops: Sequence[Any],
    before: Callable[[tf.Tensor], tf.Tensor],
    after: Callable[[tf.Tensor], tf.Tensor],
    on_eager_error: Callable[[], None],
) -> None:
    """Brackets every collective launched by `collective_ops` with callbacks.

    Each launcher (one per local device) of a TF `CollectiveAllReduce`
    creates its collectives in `all_reduce` and `_all_gather` (batch
    all-reduce, gather and IndexedSlices go through them). After this, the
    collective's input is `before(input)` and its result `after(result)`;
    an eager collective that raises calls `on_eager_error()` instead of
    `after` (in a `tf.function`, see `on_function_error`). Call once per
    object, before any value is reduced.
    """

    def bracket(op: Callable[..., Any], tensor: Any, *args: Any) -> Any:
        tensor = before(tensor)
        try:
            result = op(tensor, *args)
        except tf.errors.OpError:  # Only eager ops raise here.
            on_eager_error()
            raise
        return after(result)

    for ops in collective_ops:
        for launcher in ops._launchers:
            all_reduce, all_gather = launcher.all_reduce, launcher._all_gather

            def watched_all_reduce(
                tensor: Any, control_input: Any = None, options: Any = None, *,
                _op: Any = all_reduce,
            ) -> Any:
                return bracket(_op, tensor, control_input, options)

            def watched_all_gather(tensor: Any, options: Any, *, _op: Any = all_gather) -> Any:
                return bracket(_op, tensor, options)

            launcher.all_reduce = watched_all_reduce
            launcher._all_gather = watched_all_gather


def replace_multi_worker_cross_device_ops(extended: Any, factory: Any) -> Any:
    """Swaps MWMS's gradient cross-device ops for `factory(...)`'s result.

    `factory(devices, num_workers, options, collective_keys)` gets what TF
    built its own `CollectiveAllReduce` with; call right after the strategy
    is constructed, before any value is reduced. Returns the new ops.
    """
    ops = factory(
        list(extended.worker_devices),
        extended._num_workers,
        extended._communication_options,
        extended._collective_keys,
    )
    extended._cross_device_ops = ops
    return ops

