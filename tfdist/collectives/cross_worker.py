"""Cross-worker gradient all-reduce: hierarchical, bucketed, compressed.

`tfdist.MultiWorkerMirroredStrategy` replaces TF's cross-device ops with
`HierarchicalAllReduce`. For the dense floating-point values of one
`batch_reduce` (a step's gradients), on each of W workers with L local
devices (devices d_0 .. d_{L-1}):

    bucket: group by dtype, concatenate into buckets of <= bucket_bytes
    for each bucket:
      1. local reduce: sum the L copies onto d_0 with tfdist's in-process
         algorithms (`AllReduce`); nothing to do when L == 1
      2. cross-worker, on d_0 of every worker (TF's collective ops over gRPC,
         one group of W):
           compression=None:   all-reduce (ring)              2(W-1)/W * S bytes
           "fp16" / "bf16":    cast, all-gather, sum in float32 (W-1) * S/2 bytes
         or, with a `host_memory.HostGroup` (every worker on one host), a
         sum through shared memory (the values rounded to the wire dtype
         first with compression, summed in float32 in worker order)
      3. MEAN divides by W * L; local broadcast: copy d_0's result to d_1..
    unpack the bucket

S is the bucket's float32 size; the bytes are what each worker receives.
With compression the sum is exact float32 addition of values rounded once
to the wire dtype (as in `tfdist.MirroredStrategy`), at half the bytes of
the all-reduce for W = 2 and equal bytes for W = 3; for larger W the
all-gather receives more than a ring would (prefer no compression there).

Sparse gradients of a lookup of constant indices (a position embedding)
take this path too, as dense values: every worker's rows are the same rows
(`collectives/sparse_rows`). Everything else (other sparse `IndexedSlices`,
integer or dynamic-shape values, results on other devices,
`strategy.gather`, replica-context all-reduces such as synchronized batch
norm) takes TF's `CollectiveAllReduce` path unchanged, so behaviour outside
gradient aggregation is TF's. A step whose gradients mix the two (a token
embedding's rows beside dense kernels) is split: each value goes its own
way, in the same order on every worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist._internal import cross_device
from tfdist._internal import input_values
from tfdist._internal import tf_errors
from tfdist.collectives import sparse_rows
from tfdist.collectives import _algorithms
from tfdist.collectives import _packing
from tfdist.collectives import cross_device_ops
from tfdist.collectives import host_memory

__all__ = ["HierarchicalAllReduce"]


class HierarchicalAllReduce(cross_device.CollectiveAllReduce):  # type: ignore[misc]
    """TF's multi-worker `CollectiveAllReduce` with tfdist's gradient path.

    Contract: built by `tfdist.MultiWorkerMirroredStrategy` after TF's
    strategy set-up, identically on every worker (collective group keys are
    handed out in construction order). Every worker must trace the same
    reductions in the same order, as synchronous training does.

    Args:
      devices: This worker's local devices (one replica each).
      num_workers: Workers in the cluster.
      options: TF's `CommunicationOptions` (implementation, pack size).
      collective_keys: The strategy's `CollectiveKeys`.
      algorithm: tfdist's local algorithm (see `AllReduce`).
      bucket_bytes: Byte cap of a bucket, or `None` for one per tensor.
      compression: `None`, "fp16" or "bf16" for the cross-worker transfer.
      host_group: Carries the gradient buckets (and riders) across workers
        instead of TF's collectives when given: every worker on one host,
        each with its rank of one group. Values on TF's path still take
        TF's collectives.
    """

    def __init__(
        self,
        devices: Sequence[str],
        num_workers: int,
        options: Any,
        collective_keys: Any,
        *,
        algorithm: str,
        bucket_bytes: int | None,
        compression: cross_device_ops.Compression | str | None,
        host_group: host_memory.HostGroup | None = None,
    ) -> None:
        super().__init__(
            devices=list(devices),
            group_size=len(devices) * num_workers,
            options=options,
            collective_keys=collective_keys,
        )
        _, self._bucket_bytes, self._compression = cross_device_ops.check_options(
            algorithm, bucket_bytes, compression
        )
        self._tf_options = options
        self._local = cross_device_ops.AllReduce(algorithm, bucket_bytes=None)
        self._local_devices = cross_device.canonical_devices(devices)
        self._num_workers = num_workers
        self._host_group = host_group
        self._host_slots: dict[tuple[int, str], int] = {}
        self._cross = cross_device.CollectiveAllReduce(
            devices=list(devices[:1]),
            group_size=num_workers,
            options=options,
            collective_keys=collective_keys,
        )

    @property
    def compression(self) -> cross_device_ops.Compression:
        return self._compression

    @property
    def host_group(self) -> host_memory.HostGroup | None:
        """The host-memory group that carries gradient buckets, or None (TF's collectives)."""
        return self._host_group

    @property
    def collective_ops(self) -> tuple[Any, ...]:
        """Every TF `CollectiveAllReduce` whose launchers this object uses.

        Itself (TF's path for everything but dense gradients) and the
        one-device group that carries gradient buckets across workers; a
        watcher of cross-worker collectives must wrap both.
        """
        return (self, self._cross)

    def reduce_implementation(
        self, reduce_op: Any, per_replica_value: Any, destinations: Any, options: Any
    ) -> Any:
        pairs = [(per_replica_value, destinations)]
        if self._takes_fast_path(pairs):
            return self._batch_reduce_dense(reduce_op, pairs, options)[0][0]
        return super().reduce_implementation(
            reduce_op, per_replica_value, destinations, options
        )

    def batch_reduce_implementation(
        self, reduce_op: Any, value_destination_pairs: Any, options: Any
    ) -> Any:
        return self._reduce_by_path(reduce_op, list(value_destination_pairs), options, ())[0]

    def batch_reduce_with_riders(
        self, values: Sequence[Any], riders: Sequence[Any]
    ) -> tuple[list[Any], list[Any]]:
        """SUMs of `values` (a step's gradients) and of `riders`, riders in the same collectives.

        As `batch_reduce(SUM, ...)` of `values`, each to its own devices; and
        each rider (a float32 value, such as a logged scalar) summed exactly
        over every replica of every worker, carried in the first float32
        gradient bucket: added by its all-reduce, or, with compression, its
        bits gathered beside the compressed gradients and summed in float32
        (never rounded to the wire dtype). The riders cost a collective of
        their own only when no float32 gradient takes the bucketed path.

        Contract: called in cross-replica context (a `merge_call` of every
        local replica), identically on every worker, like `batch_reduce`.

        Args:
          values: Per-replica values (or tensors, with one local device).
          riders: Per-replica float32 tensors (or tensors) of static shape.

        Returns:
          (reduced values, reduced riders), each as `Mirrored` on the local
          devices (plain tensors with one local device).
        """
        pairs = [(value, value) for value in map(self._per_replica, values)]
        return self._reduce_by_path(
            tf.distribute.ReduceOp.SUM,
            pairs,
            self._tf_options,
            [self._per_replica(r) for r in riders],
        )

    # -- implementation ------------------------------------------------------

    def _reduce_by_path(
        self,
        reduce_op: Any,
        pairs: list[tuple[Any, Any]],
        options: Any,
        riders: Sequence[Any],
    ) -> tuple[list[Any], list[Any]]:
        """(reduced `pairs`, in order; reduced `riders`): each value on its path.

        Dense floating values take tfdist's bucketed path (`riders` in its
        first float32 bucket); the rest (a token embedding's rows beside
        dense kernels) TF's, every worker in the same order.
        """
        fast = [self._takes_fast_path([pair]) for pair in pairs]
        dense: list[Any] = []
        rider_sums: list[Any] = []
        if any(fast) or riders:
            dense, rider_sums = self._batch_reduce_dense(
                reduce_op, [p for p, f in zip(pairs, fast) if f], options, riders
            )
        slow = [p for p, f in zip(pairs, fast) if not f]
        other = iter(super().batch_reduce_implementation(reduce_op, slow, options) if slow else ())
        dense_iter = iter(dense)
        return [next(dense_iter) if f else next(other) for f in fast], rider_sums

    def _per_replica(self, value: Any) -> Any:
        if cross_device.is_distributed_value(value):
            return value
        return input_values.per_replica((value,))

    def _takes_fast_path(self, pairs: list[tuple[Any, Any]]) -> bool:
        devices = cross_device_ops.common_all_reduce_devices(pairs)
        if devices is None or tuple(devices) != self._local_devices:
            return False
        for value, _ in pairs:
            first = value.values[0]
            if isinstance(first, tf.IndexedSlices):
                if not sparse_rows.rows_align(value.values):
                    return False
                first = first.values
            tensor = tf.convert_to_tensor(first)
            if not (tensor.dtype.is_floating and tensor.shape.is_fully_defined()):
                return False
        return True

    def _batch_reduce_dense(
        self,
        reduce_op: Any,
        pairs: list[tuple[Any, Any]],
        options: Any,
        riders: Sequence[Any] = (),
    ) -> tuple[list[Any], list[Any]]:
        """The fast path's reduction of `pairs`, and of `riders` (summed).

        Returns (the reduced values, the reduced riders), one `Mirrored` each.
        """
        reduce_op = cross_device_ops.as_reduce_op(reduce_op)
        devices = list(self._local_devices)
        # Sparse values here are aligned (`_takes_fast_path`): every worker
        # and replica has the same rows, so their values are summed as dense.
        per_value = [
            [tf.convert_to_tensor(c.values if isinstance(c, tf.IndexedSlices) else c)
             for c in value.values]
            for value, _ in pairs
        ]
        shapes = [tuple(v[0].shape.as_list()) for v in per_value]
        dtypes = [v[0].dtype for v in per_value]
        results: list[list[Any]] = [[None] * len(devices) for _ in per_value]
        # Backprop produces the last layer's gradients first: buckets filled
        # in reverse order let the first collective start while earlier
        # layers' gradients are still being computed (TF's executor runs
        # each collective as soon as its bucket's inputs are ready).
        order = list(range(len(per_value)))[::-1]
        planned = _packing.plan_buckets(
            [shapes[k] for k in order], [dtypes[k] for k in order], self._bucket_bytes
        )
        # Riders (float32, summed) ride in the first float32 bucket.
        rider_flats = _rider_flats(riders, devices)
        rider_sums: list[tf.Tensor] | None = None
        for bucket in (_packing.reindex(b, order) for b in planned):
            flats = [
                _packing.pack([per_value[k][d] for k in range(len(per_value))], bucket, device)
                for d, device in enumerate(devices)
            ]
            carried = None
            if rider_flats is not None and rider_sums is None and bucket.dtype == tf.float32:
                carried = rider_flats
            reduced, carried_sums = self._reduce_bucket(
                reduce_op, flats, devices, options, carried
            )
            if carried is not None:
                rider_sums = carried_sums
            for d, device in enumerate(devices):
                for k, piece in zip(bucket.indices, _packing.unpack(reduced[d], bucket, device)):
                    results[k][d] = piece
        if rider_flats is not None and rider_sums is None:
            # No float32 gradient bucket to ride in: a collective of their own.
            rider_sums = self._reduce_exact(rider_flats, devices, options)
        for k, (value, _) in enumerate(pairs):
            if isinstance(value.values[0], tf.IndexedSlices):
                results[k] = [
                    tf.IndexedSlices(piece, c.indices, c.dense_shape)
                    for piece, c in zip(results[k], value.values)
                ]
        mirrored = [cross_device.make_mirrored(result) for result in results]
        if rider_sums is None:
            return mirrored, []
        return mirrored, _rider_results(riders, rider_sums, devices)

    def _reduce_bucket(
        self,
        reduce_op: tf.distribute.ReduceOp,
        flats: list[tf.Tensor],
        devices: list[str],
        options: Any,
        riders: list[tf.Tensor] | None = None,
    ) -> tuple[list[tf.Tensor], list[tf.Tensor] | None]:
        """Steps 1-3 of the module docstring for one flat bucket (and its riders).

        `riders` (one float32 flat per device, or None) are summed exactly
        beside the bucket; MEAN divides the bucket only. Returns the
        bucket's result and the riders' sums (None without riders), one
        tensor per device.
        """
        size = flats[0].shape[0]
        if riders is not None:
            flats = [tf.concat([f, r], 0) for f, r in zip(flats, riders)]
        if len(devices) > 1:
            local = self._local.reduce_flat(tf.distribute.ReduceOp.SUM, flats, devices)[0]
        else:
            local = flats[0]
        first = devices[0]
        wire = self._compression.wire_dtype
        rider_total = None
        with tf.device(first):
            if self._host_group is not None:
                if wire is not None and local.dtype.size > wire.size:
                    rounded = tf.cast(tf.cast(local[:size], wire), local.dtype)
                    local = rounded if riders is None else tf.concat([rounded, local[size:]], 0)
                total = self._host_all_reduce(local)
                if riders is not None:
                    total, rider_total = total[:size], total[size:]
            elif wire is None or local.dtype.size <= wire.size:
                total = cross_device.collective_all_reduce(self._cross, local, options)
                if riders is not None:
                    total, rider_total = total[:size], total[size:]
            else:
                values, exact = (local, None) if riders is None else (local[:size], local[size:])
                total, rider_total = _gathered_sum(
                    wire, self._cross, values, exact, self._num_workers, options
                )
            if reduce_op == tf.distribute.ReduceOp.MEAN:
                total = total / tf.cast(
                    self._num_workers * len(self._local_devices), total.dtype
                )
        return _to_devices(total, first, devices), (
            None if rider_total is None else _to_devices(rider_total, first, devices)
        )

    def _reduce_exact(
        self, flats: list[tf.Tensor], devices: list[str], options: Any
    ) -> list[tf.Tensor]:
        """The SUM of one flat per device over every replica, uncompressed."""
        if len(devices) > 1:
            local = self._local.reduce_flat(tf.distribute.ReduceOp.SUM, flats, devices)[0]
        else:
            local = flats[0]
        with tf.device(devices[0]):
            if self._host_group is not None:
                total = self._host_all_reduce(local)
            else:
                total = cross_device.collective_all_reduce(self._cross, local, options)
        return _to_devices(total, devices[0], devices)

    def _host_all_reduce(self, flat: tf.Tensor) -> tf.Tensor:
        """The SUM of `flat` over the workers through the host group (a stateful op).

        One slot per size and dtype: a tf.function runs these ops in program
        order, the same on every worker, one at a time.
        """
        group = self._host_group
        assert group is not None
        key = (int(flat.shape[0]), flat.dtype.name)
        slot = self._host_slots.setdefault(key, len(self._host_slots))

        def host_sum(x: Any) -> Any:
            try:
                return group.all_reduce(x, slot)
            except errors.CollectiveError as e:
                raise tf_errors.marked_op_error(e) from e

        total = tf.numpy_function(host_sum, [flat], flat.dtype, stateful=True, name="tfdist_host_all_reduce")
        total.set_shape(flat.shape)
        return total


def _to_devices(value: tf.Tensor, source: str, devices: list[str]) -> list[tf.Tensor]:
    """`value` (on `source`, the first of `devices`) and a copy on each other device."""
    return [value] + [_algorithms.send(value, source, d, None) for d in devices[1:]]


def _rider_flats(riders: Sequence[Any], devices: list[str]) -> list[tf.Tensor] | None:
    """Each device's riders as one float32 vector (None without riders)."""
    if not riders:
        return None
    flats = []
    for d, device in enumerate(devices):
        with tf.device(device):
            flats.append(tf.concat(
                [tf.reshape(tf.cast(r.values[d], tf.float32), [-1]) for r in riders], 0
            ))
    return flats


def _rider_results(
    riders: Sequence[Any], sums: list[tf.Tensor], devices: list[str]
) -> list[Any]:
    """The riders' sums (one flat per device) cut back into each rider's shape."""
    results: list[list[tf.Tensor]] = [[] for _ in riders]
    for d, device in enumerate(devices):
        with tf.device(device):
            offset = 0
            for k, rider in enumerate(riders):
                shape = rider.values[d].shape
                size = shape.num_elements()
                piece = tf.reshape(sums[d][offset:offset + size], shape)
                results[k].append(tf.cast(piece, rider.values[d].dtype))
                offset += size
    return [cross_device.make_mirrored(r) for r in results]


def _gathered_sum(
    wire: tf.DType,
    ops: Any,
    values: tf.Tensor,
    exact: tf.Tensor | None,
    num_workers: int,
    options: Any,
) -> tuple[tf.Tensor, tf.Tensor | None]:
    """Sums over the workers: `values` rounded to `wire`, `exact` (float32) bit for bit.

    One all-gather carries both: `exact`'s float32 bits travel as pairs of
    16-bit words (a gather only moves bytes), and each worker adds the
    gathered rows in float32, in worker order.
    """
    compressed = tf.cast(values, wire)
    parts = [tf.bitcast(compressed, tf.float16) if wire == tf.bfloat16 else compressed]
    if exact is not None:
        parts.append(tf.reshape(tf.bitcast(exact, tf.float16), [-1]))
    message = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
    gathered = tf.reshape(cross_device.collective_all_gather(ops, message, options), [num_workers, -1])
    size = values.shape[0]
    rows = gathered[:, :size]
    if wire == tf.bfloat16:
        rows = tf.bitcast(rows, tf.bfloat16)
    total = tf.reduce_sum(tf.cast(rows, values.dtype), axis=0)
    if exact is None:
        return total, None
    bits = tf.reshape(gathered[:, size:], [num_workers, -1, 2])
    return total, tf.reduce_sum(tf.bitcast(bits, tf.float32), axis=0)
