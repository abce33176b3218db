"""TF's cross-device ops and collective launchers, as tfdist extends them (TF private).

Private TF API used (tested range: see setup.py):

- `distribute_utils.regroup` + `values.Mirrored`: a `CrossDeviceOps` must
  return `Mirrored` values, and TF has no public constructor for them;
- `cross_device_ops.get_devices_from` / `check_destinations` and
  `device_util.canonicalize`: resolve a `destinations` argument and name
  devices as TF's own ops do;
- `cross_device_ops.CollectiveAllReduce` and its launchers
  (`_launchers`, `all_reduce`, `_all_gather`): tfdist's cross-worker
  all-reduce subclasses TF's multi-worker cross-device ops and launches its
  collectives through TF's launcher (group and instance keys, ordering
  tokens); the watchdog wraps every launcher's collectives
  (`watch_collectives`);
- `CrossDeviceOps._gather_implementation`: TF's hook behind
  `strategy.gather` (`GatheringCrossDeviceOps` exposes it);
- MWMS's extended attributes `_host_cross_device_ops`,
  `_cross_device_ops`, `_num_workers`, `_communication_options`,
  `_collective_keys` and `_get_variable_creator_initial_value` (the
  one-time broadcast of initial variable values).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import cross_device_ops as _cross_device_ops
from tensorflow.python.distribute import device_util as _device_util
from tensorflow.python.distribute import distribute_utils as _distribute_utils
from tensorflow.python.distribute import values as _values

__all__ = [
    "CollectiveAllReduce",
    "GatheringCrossDeviceOps",
    "canonical_devices",
    "collective_all_gather",
    "collective_all_reduce",
    "destination_devices",
    "host_collective_ops",
    "is_distributed_value",
    "make_mirrored",
    "replace_multi_worker_cross_device_ops",
    "watch_collectives",
    "watch_initial_value_broadcasts",
]

#: TF's multi-worker cross-device ops (MultiWorkerMirroredStrategy's).
CollectiveAllReduce = _cross_device_ops.CollectiveAllReduce


class GatheringCrossDeviceOps(tf.distribute.CrossDeviceOps):
    """A `CrossDeviceOps` that can gather: `strategy.gather`, `all_gather`.

    TF's strategies call the private `_gather_implementation`, which the
    public base class leaves unimplemented; this class sends it to the
    public-named `gather_implementation`, which a subclass implements.
    """

    def _gather_implementation(
        self, per_replica_value: Any, destinations: Any, axis: int, options: Any
    ) -> Any:
        return self.gather_implementation(per_replica_value, destinations, axis, options)

    def gather_implementation(
        self, per_replica_value: Any, destinations: Any, axis: int, options: Any
    ) -> Any:
        """Concatenation along `axis` of every replica's value, on `destinations`."""
        raise NotImplementedError


def make_mirrored(per_device: Sequence[Any]) -> Any:
    """Wraps one tensor (or IndexedSlices) per device as `Mirrored`.

    A single value is returned as is, as TF's own CrossDeviceOps do.
    """
    return _distribute_utils.regroup(tuple(per_device), wrap_class=_values.Mirrored)


def canonical_devices(devices: Sequence[str]) -> tuple[str, ...]:
    """`devices` fully named, as TF's cross-device ops name them."""
    return tuple(_device_util.canonicalize(d) for d in devices)


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
    on_eager_error: Callable[[tf.errors.OpError], BaseException],
) -> None:
    """Brackets every collective launched by `collective_ops` with callbacks.

    Each launcher (one per local device) of a TF `CollectiveAllReduce`
    creates its collectives in `all_reduce` and `_all_gather` (batch
    all-reduce, gather and IndexedSlices go through them). After this, the
    collective's input is `before(input)` and its result `after(result)`;
    an eager collective that raises `e` raises `on_eager_error(e)` instead
    (which may be `e` itself). Call once per object, before any value is
    reduced.
    """

    def bracket(op: Callable[..., Any], tensor: Any, *args: Any) -> Any:
        tensor = before(tensor)
        try:
            result = op(tensor, *args)
        except tf.errors.OpError as e:  # Only eager ops raise here.
            converted = on_eager_error(e)
            if converted is e:
                raise
            raise converted from e
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


def watch_initial_value_broadcasts(
    extended: Any, watch: Callable[[Callable[[], Any]], Any]
) -> None:
    """Runs every initial-value broadcast of MWMS's variable creation in `watch`.

    TF's MultiWorkerMirroredStrategy gives every new variable the chief's
    initial value through a collective broadcast (`broadcast_send` on the
    chief, `broadcast_recv` elsewhere) that TF's own code calls directly.
    After this, each such initial-value function `fn` runs as `watch(fn)`.
    Call right after the strategy is constructed, before variables are made.
    """
    original = extended._get_variable_creator_initial_value

    def watched(replica_id: int, device: Any, primary_var: Any, **kwargs: Any) -> Any:
        initial_value_fn = original(replica_id, device, primary_var, **kwargs)
        if replica_id != 0:  # Later local replicas copy the first one's value.
            return initial_value_fn
        return lambda: watch(initial_value_fn)

    extended._get_variable_creator_initial_value = watched


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
