"""tfdist's all-reduce algorithms as `tf.distribute.CrossDeviceOps`.

`MirroredStrategy` hands every gradient of a step to one
`batch_reduce_implementation` call (Keras 3 and tf-keras both all-reduce
gradients that way). That call:

    split the values into dense tensors and IndexedSlices
    dense:  plan buckets of <= bucket_bytes per dtype          (_packing)
            "auto" only: if the cost model says packing costs more than
                the collectives it saves, reduce each member alone
            per bucket: pack on every device (one concat),
                        choose the algorithm (fixed, or the cost model),
                        all-reduce the flat buffers            (_algorithms)
                        unpack on every device (one split)
    sparse: all-gather indices and values onto every device (never densify);
            but where every replica looked up the same constant indices (a
            position embedding), all-reduce the values as dense: one
            device's gradient has one row per index, summed over the batch
            (`collectives/sparse_rows`; Adam squares rows before summing)
    MEAN:   divide by the number of replicas after the SUM
    wrap each result as a Mirrored value

Reductions whose destination is not the set of devices holding the value
(for example `strategy.reduce` to the host) are not all-reduces; they go to
`tf.distribute.ReductionToOneDevice`, as in TF's own ops.

Contract: these are in-process collectives for the devices of one worker.
They are called by the strategy in cross-replica context (inside
`merge_call`), once per call on behalf of all replicas; they add ops to the
current graph and block nothing at trace time.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist._internal import cross_device
from tfdist.collectives import sparse_rows
from tfdist import _validation as validation
from tfdist.collectives import _algorithms
from tfdist.collectives import _packing
from tfdist.collectives import cost_model as cost_model_lib

__all__ = [
    "AllReduce",
    "AutoAllReduce",
    "Compression",
    "DEFAULT_BUCKET_BYTES",
    "ReduceToOneAllReduce",
    "RingAllReduce",
    "TreeAllReduce",
]

#: Default gradient bucket: 4 MiB per dtype, a few collectives per step for
#: typical models while leaving room to overlap.
DEFAULT_BUCKET_BYTES = 4 << 20

ALGORITHM_NAMES = ("auto", *_algorithms.ALGORITHMS)


class Compression(enum.Enum):
    """Wire format for floating-point transfers; sums stay in float32."""

    NONE = None
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def wire_dtype(self) -> tf.DType | None:
        return {None: None, "fp16": tf.float16, "bf16": tf.bfloat16}[self.value]


def check_options(
    algorithm: str,
    bucket_bytes: int | None,
    compression: Compression | str | None,
) -> tuple[str, int | None, Compression]:
    """Validates `AllReduce`'s options without touching the TF runtime.

    Strategies call it before they resolve devices, so bad options fail
    before anything starts.

    Returns:
      `(algorithm, bucket_bytes, compression)`, normalised.

    Raises:
      ConfigError: Unknown algorithm or compression, non-positive bucket.
      TypeError: `bucket_bytes` is not an int.
    """
    validation.check_one_of("all_reduce", algorithm, ALGORITHM_NAMES)
    if bucket_bytes is not None:
        validation.check_positive_int("bucket_bytes", bucket_bytes)
    if not isinstance(compression, Compression):
        validation.check_one_of(
            "compression", compression, [c.value for c in Compression]
        )
        compression = Compression(compression)
    return algorithm, bucket_bytes, compression


class AllReduce(cross_device.GatheringCrossDeviceOps):  # type: ignore[misc]
    """In-process all-reduce with bucketing, compression and sparse support.

    Pass it as `cross_device_ops` to `tf.distribute.MirroredStrategy`, or let
    `tfdist.MirroredStrategy(all_reduce=...)` build it.

    Contract: called by the strategy in cross-replica context (inside
    `merge_call`), once per reduction on behalf of all replicas; every value
    must have one component per device, identical shape and dtype on every
    device. Results are `Mirrored` values, identical on every device.

    Args:
      algorithm: "auto" (choose per bucket with the cost model), "ring",
        "tree" or "reduce_to_one".
      bucket_bytes: Byte cap of a gradient bucket (per dtype), >= 1, or
        `None` for one collective per tensor.
      compression: `None`, "fp16" or "bf16": floating-point values travel
        in that dtype and are summed in their own dtype. Integer values are
        never compressed.
      cost_model: The `CostModel` for "auto"; by default the process-wide
        one, which calibrates on the actual devices at first use.
      results_needed: "all" (an all-reduce), or "first" when the caller
        uses only the first device's result (the rest of the graph is then
        pruned); "auto" then compares the algorithms' reduce-only costs.

    Raises:
      ConfigError: For an unknown algorithm or compression, or a
        non-positive `bucket_bytes`.
      TypeError: If `bucket_bytes` is not an int.

    Example:
      >>> strategy = tf.distribute.MirroredStrategy(
      ...     ["/cpu:0", "/cpu:1"], cross_device_ops=AllReduce("ring"))
    """

    def __init__(
        self,
        algorithm: str = "auto",
        *,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        compression: Compression | str | None = None,
        cost_model: cost_model_lib.CostModel | None = None,
        results_needed: str = "all",
    ) -> None:
        super().__init__()
        self._reduce_only = (
            validation.check_one_of("results_needed", results_needed, ("all", "first"))
            == "first"
        )
        self._algorithm, self._bucket_bytes, self._compression = check_options(
            algorithm, bucket_bytes, compression
        )
        self._cost_model = cost_model or cost_model_lib.default_cost_model()
        self._fallback = tf.distribute.ReductionToOneDevice()

    def with_results_needed(self, results_needed: str) -> AllReduce:
        """A copy of this op with another `results_needed` (same settings)."""
        return AllReduce(
            self._algorithm,
            bucket_bytes=self._bucket_bytes,
            compression=self._compression,
            cost_model=self._cost_model,
            results_needed=results_needed,
        )

    @property
    def results_needed(self) -> str:
        """"all", or "first" when only the first device's result is used."""
        return "first" if self._reduce_only else "all"

    @property
    def algorithm(self) -> str:
        """The configured algorithm name ("auto" chooses per bucket)."""
        return self._algorithm

    @property
    def bucket_bytes(self) -> int | None:
        return self._bucket_bytes

    @property
    def compression(self) -> Compression:
        return self._compression

    def choose_algorithm(self, devices: Sequence[str], num_bytes: int) -> str:
        """The algorithm this op uses for a `num_bytes` message on `devices`."""
        if len(devices) == 1:
            return "reduce_to_one"
        if self._algorithm != "auto":
            return self._algorithm
        return self._cost_model.choose(
            num_devices=len(devices),
            num_bytes=num_bytes,
            devices=devices,
            reduce_only=self._reduce_only,
        )

    # -- tf.distribute.CrossDeviceOps hooks ---------------------------------

    def reduce_implementation(
        self, reduce_op: Any, per_replica_value: Any, destinations: Any, options: Any
    ) -> Any:
        # Args typed Any: TF passes ReduceOp, DistributedValues, and
        # destinations of several kinds (see CrossDeviceOps.reduce).
        return self.batch_reduce_implementation(
            reduce_op, [(per_replica_value, destinations)], options
        )[0]

    def batch_reduce_implementation(
        self, reduce_op: Any, value_destination_pairs: Any, options: Any
    ) -> list[Any]:
        reduce_op = as_reduce_op(reduce_op)
        pairs = list(value_destination_pairs)
        if not pairs:
            return []
        devices = common_all_reduce_devices(pairs)
        if devices is None:
            return self._fallback.batch_reduce_implementation(
                reduce_op, pairs, options
            )
        per_device = [list(value.values) for value, _ in pairs]
        results = self._reduce_per_device(reduce_op, per_device, devices)
        return [cross_device.make_mirrored(result) for result in results]

    def gather_implementation(
        self, per_replica_value: Any, destinations: Any, axis: int, options: Any
    ) -> Any:
        # Behind strategy.gather and ReplicaContext.all_gather.
        values = list(per_replica_value.values)
        sources = [v.device for v in values]
        devices = cross_device.destination_devices(destinations, per_replica_value)
        gathered = []
        for device in devices:
            with tf.device(device):
                gathered.append(
                    tf.concat(
                        [_algorithms.send(v, s, device, None) for v, s in zip(values, sources)],
                        axis=axis,
                    )
                )
        return cross_device.make_mirrored(gathered)

    # -- implementation ------------------------------------------------------

    def _reduce_per_device(
        self,
        reduce_op: tf.distribute.ReduceOp,
        per_value: list[list[Any]],
        devices: Sequence[str],
    ) -> list[list[Any]]:
        """All-reduces `per_value[k][d]` (value k on device d) over devices."""
        n = len(devices)
        results: list[list[Any]] = [[None] * n for _ in per_value]
        dense = []
        # Sparse values whose rows are the same on every replica (a lookup of
        # fixed positions): their values are all-reduced as dense tensors.
        aligned: dict[int, list[tf.IndexedSlices]] = {}
        for k, components in enumerate(per_value):
            if isinstance(components[0], tf.IndexedSlices):
                if not sparse_rows.rows_align(components):
                    results[k] = self._all_gather_sparse(reduce_op, components, devices)
                    continue
                aligned[k] = components
                per_value[k] = [c.values for c in components]
                dense.append(k)
            else:
                tensors = [tf.convert_to_tensor(c) for c in components]
                if tensors[0].shape.is_fully_defined():
                    dense.append(k)
                else:  # Dynamic shape: no packing; AddN takes any shape.
                    results[k] = self.reduce_flat(
                        reduce_op, tensors, devices, algorithm="reduce_to_one"
                    )
                per_value[k] = tensors
        shapes = [tuple(per_value[k][0].shape.as_list()) for k in dense]
        dtypes = [per_value[k][0].dtype for k in dense]
        dense_by_device = [[per_value[k][d] for k in dense] for d in range(n)]
        for bucket in _packing.plan_buckets(shapes, dtypes, self._bucket_bytes):
            members = [dense[i] for i in bucket.indices]
            if sum(bucket.sizes) == 0:  # Only empty tensors: nothing to move.
                for k in members:
                    results[k] = [tf.identity(t) for t in per_value[k]]
                continue
            if not self._packing_pays(bucket, devices):
                for k in members:
                    results[k] = self._reduce_unpacked(
                        reduce_op, per_value[k], devices
                    )
                continue
            flats = [
                _packing.pack(dense_by_device[d], bucket, device)
                for d, device in enumerate(devices)
            ]
            reduced = self.reduce_flat(reduce_op, flats, devices)
            for d, device in enumerate(devices):
                pieces = _packing.unpack(reduced[d], bucket, device)
                for k, piece in zip(members, pieces):
                    results[k][d] = piece
        for k, components in aligned.items():
            results[k] = [
                tf.IndexedSlices(values, c.indices, c.dense_shape)
                for values, c in zip(results[k], components)
            ]
        return results

    def _packing_pays(self, bucket: _packing.Bucket, devices: Sequence[str]) -> bool:
        """Fixed algorithms always pack; "auto" asks the cost model."""
        if self._algorithm != "auto" or len(bucket.indices) == 1 or len(devices) == 1:
            return True
        return self._cost_model.should_pack(
            num_devices=len(devices),
            member_bytes=[size * bucket.dtype.size for size in bucket.sizes],
            devices=devices,
            reduce_only=self._reduce_only,
        )

    def _reduce_unpacked(
        self,
        reduce_op: tf.distribute.ReduceOp,
        tensors: list[tf.Tensor],
        devices: Sequence[str],
    ) -> list[tf.Tensor]:
        """One collective for one tensor: reshaped to 1-D, not copied."""
        shape = tensors[0].shape
        flats = []
        for tensor, device in zip(tensors, devices):
            with tf.device(device):
                flats.append(tf.reshape(tensor, [-1]))
        reduced = self.reduce_flat(reduce_op, flats, devices)
        outputs = []
        for tensor, device in zip(reduced, devices):
            with tf.device(device):
                outputs.append(tf.reshape(tensor, shape))
        return outputs

    def reduce_flat(
        self,
        reduce_op: tf.distribute.ReduceOp,
        flats: list[tf.Tensor],
        devices: Sequence[str],
        algorithm: str | None = None,
    ) -> list[tf.Tensor]:
        """SUM or MEAN of one 1-D (or dynamic-shape) tensor per device."""
        dtype = flats[0].dtype
        wire = self._compression.wire_dtype
        if algorithm is None:
            compressed = wire is not None and dtype.is_floating and dtype.size > wire.size
            itemsize = wire.size if compressed and wire is not None else dtype.size
            num_bytes = flats[0].shape.num_elements() * itemsize
            algorithm = self.choose_algorithm(devices, num_bytes)
        summed = _algorithms.ALGORITHMS[algorithm](flats, devices, wire)
        if reduce_op == tf.distribute.ReduceOp.MEAN:
            summed = [_divide(t, len(devices), d) for t, d in zip(summed, devices)]
        return summed

    def _all_gather_sparse(
        self,
        reduce_op: tf.distribute.ReduceOp,
        slices: list[tf.IndexedSlices],
        devices: Sequence[str],
    ) -> list[tf.IndexedSlices]:
        """Sum of IndexedSlices as the concatenation of every replica's rows."""
        n = len(devices)
        sources = [s.values.device for s in slices]
        wire = self._compression.wire_dtype
        gathered = []
        for device in devices:
            values = [
                _algorithms.send(s.values, src, device, wire) for s, src in zip(slices, sources)
            ]
            indices = [_algorithms.send(s.indices, src, device, None) for s, src in zip(slices, sources)]
            with tf.device(device):
                merged_values = tf.concat(values, axis=0)
                if reduce_op == tf.distribute.ReduceOp.MEAN:
                    merged_values = _divide(merged_values, n, device)
                gathered.append(
                    tf.IndexedSlices(
                        merged_values,
                        tf.concat(indices, axis=0),
                        slices[0].dense_shape,
                    )
                )
        return gathered


class RingAllReduce(AllReduce):
    """`AllReduce` with the ring algorithm: bandwidth-optimal for large S."""

    def __init__(
        self,
        *,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        compression: Compression | str | None = None,
    ) -> None:
        super().__init__("ring", bucket_bytes=bucket_bytes, compression=compression)


class TreeAllReduce(AllReduce):
    """`AllReduce` with a binary tree: 2*ceil(log2 n) steps, latency-bound."""

    def __init__(
        self,
        *,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        compression: Compression | str | None = None,
    ) -> None:
        super().__init__("tree", bucket_bytes=bucket_bytes, compression=compression)


class ReduceToOneAllReduce(AllReduce):
    """`AllReduce` that sums on the first device and copies the result out."""

    def __init__(
        self,
        *,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        compression: Compression | str | None = None,
    ) -> None:
        super().__init__(
            "reduce_to_one", bucket_bytes=bucket_bytes, compression=compression
        )


class AutoAllReduce(AllReduce):
    """`AllReduce` that picks ring, tree or reduce-to-one per bucket.

    The choice minimises the alpha-beta model's predicted time (see
    `tfdist.collectives.cost_model`), calibrated once on the actual devices
    unless `cost_model` is given.
    """

    def __init__(
        self,
        *,
        bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        compression: Compression | str | None = None,
        cost_model: cost_model_lib.CostModel | None = None,
    ) -> None:
        super().__init__(
            "auto",
            bucket_bytes=bucket_bytes,
            compression=compression,
            cost_model=cost_model,
        )


def as_reduce_op(reduce_op: Any) -> tf.distribute.ReduceOp:
    if isinstance(reduce_op, tf.distribute.ReduceOp):
        return reduce_op
    if isinstance(reduce_op, str) and reduce_op.upper() in ("SUM", "MEAN"):
        return tf.distribute.ReduceOp(reduce_op.upper())
    raise errors.ConfigError(
        f"reduce_op={reduce_op!r} is not supported; expected "
        "tf.distribute.ReduceOp.SUM or .MEAN (or 'SUM' / 'MEAN')."
    )


def common_all_reduce_devices(pairs: list[tuple[Any, Any]]) -> tuple[str, ...] | None:
    """The shared device list if every pair is an all-reduce over it."""
    devices = None
    for value, destinations in pairs:
        if not cross_device.is_distributed_value(value):
            return None
        value_devices = cross_device.destination_devices(None, value)
        target = cross_device.destination_devices(destinations, value)
        if set(target) != set(value_devices) or len(target) != len(value_devices):
            return None
        if devices is None:
            devices = value_devices
        elif devices != value_devices:
            return None
    return devices


def _divide(value: tf.Tensor, n: int, device: str) -> tf.Tensor:
    """MEAN from SUM; integer dtypes use floor division and keep their dtype."""
    with tf.device(device):
        if value.dtype.is_integer:
            return tf.math.floordiv(value, tf.cast(n, value.dtype))
        return value / tf.cast(n, value.dtype)
