"""tfdist.collectives.AllReduce on raw per-device tensors, against numpy."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist import collectives
from tfdist import errors
from tests.conformance import harness

DEVICES = tuple(f"/device:CPU:{i}" for i in range(4))
ALGORITHMS = ("ring", "tree", "reduce_to_one", "auto")
# Each replica's value is (replica_id + 1) * base, so the SUM is
# base * n(n+1)/2: exact in float32 for the small integers used here.
SHAPES = {"odd_length": (7,), "matrix": (3, 5), "scalar": (), "empty": (0,)}
# fp16 keeps 11 significant bits; values below are O(10), so a relative
# error of a few 2^-11 per transfer bounds the result.
FP16_RTOL = 4e-3
# bf16 keeps 8 significant bits.
BF16_RTOL = 3e-2


def _per_replica(strategy, base):
    """A PerReplica value whose replica r holds (r + 1) * base, on device r.

    Built with `strategy.run`: TF 2.21's
    `experimental_distribute_values_from_function` leaves every value on
    CPU:0 when the devices are CPUs, which would hide placement bugs.
    """
    return _run_per_replica(
        strategy, lambda r: tf.constant(base) * tf.cast(r + 1, base.dtype)
    )


def _run_per_replica(strategy, fn):
    """strategy.run of fn(replica_id) -> one value per device."""
    return strategy.run(
        lambda: fn(tf.distribute.get_replica_context().replica_id_in_sync_group)
    )


def _locals(strategy, value):
    return [v.numpy() for v in strategy.experimental_local_results(value)]


def _strategy(num_devices):
    # Collective keys of its own: test files share processes (harness's docstring).
    return harness.tf_mirrored_strategy(DEVICES[:num_devices])


def _producer_device_index(tensor):
    """Device index of the op that computed `tensor` (skipping unplaced Identity)."""
    op = tensor.op
    while not op.device and op.type == "Identity":
        op = op.inputs[0].op
    return tf.DeviceSpec.from_string(op.device).device_index


def _grid():
    for algorithm in ALGORITHMS:
        for n in (2, 3, 4):
            yield {"testcase_name": f"{algorithm}_{n}cpu", "algorithm": algorithm, "n": n}


class AllReduceSumTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(*_grid())
    def test_sum_matches_numpy_for_awkward_shapes(self, algorithm, n):
        strategy = _strategy(n)
        ops = collectives.AllReduce(algorithm, bucket_bytes=32)
        bases = {
            name: np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
            for name, shape in SHAPES.items()
        }
        values = [_per_replica(strategy, b) for b in bases.values()]
        results = ops.batch_reduce(
            tf.distribute.ReduceOp.SUM, [(v, v) for v in values]
        )
        scale = n * (n + 1) // 2
        for base, result in zip(bases.values(), results):
            for local in _locals(strategy, result):
                self.assertAllEqual(local, base * scale)

    @parameterized.named_parameters(*_grid())
    def test_sum_inside_tf_function_places_result_on_every_device(
        self, algorithm, n
    ):
        strategy = _strategy(n)
        ops = collectives.AllReduce(algorithm)
        base = np.linspace(-1, 1, 1001).astype(np.float32)

        @tf.function
        def reduce():
            # Built inside the function: PerReplica arguments of a
            # tf.function lose their devices.
            value = _per_replica(strategy, base)
            result = ops.reduce(tf.distribute.ReduceOp.SUM, value, value)
            return strategy.experimental_local_results(result)

        components = reduce()
        graph = reduce.get_concrete_function().graph
        self.assertEqual(
            [_producer_device_index(t) for t in graph.outputs], list(range(n))
        )
        for local in components:
            self.assertAllClose(local, base * (n * (n + 1) // 2), rtol=1e-6)

    @parameterized.named_parameters(
        {"testcase_name": "packing_pays", "pack_beta": 0.0, "concats": 4},
        {"testcase_name": "packing_costs_more", "pack_beta": 1e-6, "concats": 0},
    )
    def test_auto_packs_a_bucket_only_when_the_cost_model_says_it_pays(
        self, pack_beta, concats
    ):
        strategy = _strategy(4)
        links = {
            name: collectives.AlphaBeta(alpha_s=1e-6, beta_s_per_byte=1e-10)
            for name in ("ring", "tree", "reduce_to_one")
        }
        model = collectives.CostModel(
            links, pack=collectives.AlphaBeta(alpha_s=0.0, beta_s_per_byte=pack_beta)
        )
        ops = collectives.AllReduce("auto", cost_model=model)
        bases = [np.arange(6, dtype=np.float32), np.ones((2, 3), np.float32)]

        @tf.function
        def reduce():
            values = [_per_replica(strategy, b) for b in bases]
            return ops.batch_reduce(
                tf.distribute.ReduceOp.SUM, [(v, v) for v in values]
            )

        graph = reduce.get_concrete_function().graph
        self.assertLen(
            [op for op in graph.get_operations() if op.type == "ConcatV2"], concats
        )
        for base, result in zip(bases, reduce()):
            for local in _locals(strategy, result):
                self.assertAllEqual(local, base * 10)

    @parameterized.named_parameters(
        {"testcase_name": a, "algorithm": a} for a in ALGORITHMS
    )
    def test_mixed_dtypes_in_one_batch_keep_their_dtypes(self, algorithm):
        strategy = _strategy(4)
        ops = collectives.AllReduce(algorithm, bucket_bytes=16)
        bases = [
            np.arange(5, dtype=np.float32),
            np.arange(6, dtype=np.int32),
            np.arange(3, dtype=np.float64),
            np.arange(4, dtype=np.float32) + 10,
        ]
        values = [_per_replica(strategy, b) for b in bases]
        results = ops.batch_reduce(
            tf.distribute.ReduceOp.SUM, [(v, v) for v in values]
        )
        for base, result in zip(bases, results):
            for local in _locals(strategy, result):
                self.assertEqual(local.dtype, base.dtype)
                self.assertAllEqual(local, base * 10)

    @parameterized.named_parameters(
        {"testcase_name": a, "algorithm": a} for a in ALGORITHMS
    )
    def test_mean_divides_by_replica_count(self, algorithm):
        strategy = _strategy(4)
        ops = collectives.AllReduce(algorithm)
        base = np.arange(9, dtype=np.float32)
        value = _per_replica(strategy, base)
        result = ops.reduce(tf.distribute.ReduceOp.MEAN, value, value)
        for local in _locals(strategy, result):
            self.assertAllClose(local, base * 2.5)

    def test_integer_mean_floors_and_keeps_dtype(self):
        strategy = _strategy(4)
        ops = collectives.RingAllReduce()
        value = _per_replica(strategy, np.array([1, 2, 3], np.int32))
        result = ops.reduce("MEAN", value, value)
        for local in _locals(strategy, result):
            self.assertEqual(local.dtype, np.int32)
            self.assertAllEqual(local, [2, 5, 7])  # floor([10, 20, 30] / 4)

    def test_reduce_to_host_falls_back_to_a_single_device_result(self):
        strategy = _strategy(2)
        ops = collectives.RingAllReduce()
        value = _per_replica(strategy, np.ones(3, np.float32))
        result = ops.reduce(tf.distribute.ReduceOp.SUM, value, "/cpu:0")
        self.assertAllEqual(result.numpy(), [3.0, 3.0, 3.0])


class CompressionTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(
        {"testcase_name": f"{a}_{c}", "algorithm": a, "compression": c, "rtol": r}
        for a in ("ring", "tree", "reduce_to_one")
        for c, r in (("fp16", FP16_RTOL), ("bf16", BF16_RTOL))
    )
    def test_compressed_sum_is_float32_and_within_tolerance(
        self, algorithm, compression, rtol
    ):
        strategy = _strategy(4)
        ops = collectives.AllReduce(algorithm, compression=compression)
        base = np.linspace(0.5, 1.5, 1000).astype(np.float32)
        value = _per_replica(strategy, base)
        result = ops.reduce(tf.distribute.ReduceOp.SUM, value, value)
        for local in _locals(strategy, result):
            self.assertEqual(local.dtype, np.float32)
            self.assertAllClose(local, base * 10, rtol=rtol)
        # The wire format must really be 16-bit: these values are not all
        # representable in it, so the last device's copy shows rounding.
        self.assertGreater(
            np.max(np.abs(_locals(strategy, result)[-1] - base * 10)), 0
        )

    def test_integers_are_never_compressed(self):
        strategy = _strategy(2)
        ops = collectives.RingAllReduce(compression="fp16")
        base = np.array([70000, 3], np.int32)  # 70000 does not fit in fp16.
        value = _per_replica(strategy, base)
        result = ops.reduce(tf.distribute.ReduceOp.SUM, value, value)
        for local in _locals(strategy, result):
            self.assertAllEqual(local, base * 3)


class SparseAndGatherTest(tf.test.TestCase):

    def test_indexed_slices_are_all_gathered_not_densified(self):
        strategy = _strategy(4)
        ops = collectives.RingAllReduce()
        value = _run_per_replica(
            strategy,
            lambda r: tf.IndexedSlices(
                tf.ones([2, 3]) * tf.cast(r + 1, tf.float32),
                tf.stack([tf.constant(0, tf.int64), tf.cast(r + 1, tf.int64)]),
                tf.constant([6, 3], tf.int64),
            ),
        )
        result = ops.reduce(tf.distribute.ReduceOp.SUM, value, value)
        expected = np.zeros([6, 3], np.float32)
        for r in range(4):
            expected[0] += r + 1
            expected[r + 1] += r + 1
        for local in strategy.experimental_local_results(result):
            self.assertIsInstance(local, tf.IndexedSlices)
            self.assertEqual(local.indices.shape[0], 8)  # 4 replicas x 2 rows
            self.assertAllEqual(tf.convert_to_tensor(local), expected)

    def test_gather_concatenates_replicas_in_order(self):
        strategy = tfdist.MirroredStrategy(list(DEVICES[:3]), all_reduce="ring")
        value = _run_per_replica(strategy, lambda r: tf.fill([2, 2], r))
        gathered = strategy.gather(value, axis=0)
        self.assertAllEqual(
            gathered, np.repeat(np.arange(3), 4).reshape(6, 2)
        )

    def test_replica_context_all_gather_gives_every_replica_all_rows(self):
        strategy = tfdist.MirroredStrategy(list(DEVICES[:2]), all_reduce="tree")

        @tf.function
        def step():
            def fn():
                ctx = tf.distribute.get_replica_context()
                return ctx.all_gather(
                    tf.reshape(tf.cast(ctx.replica_id_in_sync_group, tf.float32), [1]),
                    axis=0,
                )
            return strategy.run(fn)

        for local in strategy.experimental_local_results(step()):
            self.assertAllEqual(local, [0.0, 1.0])


class ConfigErrorTest(parameterized.TestCase):

    @parameterized.named_parameters(
        {"testcase_name": "unknown_algorithm", "kwargs": {"algorithm": "butterfly"}, "text": "butterfly"},
        {"testcase_name": "zero_bucket", "kwargs": {"bucket_bytes": 0}, "text": "bucket_bytes=0"},
        {"testcase_name": "negative_bucket", "kwargs": {"bucket_bytes": -5}, "text": "bucket_bytes=-5"},
        {"testcase_name": "unknown_compression", "kwargs": {"compression": "int8"}, "text": "int8"},
    )
    def test_bad_argument_raises_config_error_naming_the_value(self, kwargs, text):
        with self.assertRaisesRegex(errors.ConfigError, text):
            collectives.AllReduce(**kwargs)

    def test_non_int_bucket_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, "bucket_bytes"):
            collectives.AllReduce(bucket_bytes="4MB")


class BucketPlanTest(tf.test.TestCase):

    def test_buckets_planned_in_reverse_map_back_to_original_positions(self):
        from tfdist.collectives import _packing

        shapes = [(4,), (2, 2), (8,), (1,)]
        order = [3, 2, 1, 0]
        planned = _packing.plan_buckets(
            [shapes[k] for k in order], [tf.float32] * 4, bucket_bytes=40
        )
        buckets = [_packing.reindex(b, order) for b in planned]
        # Reverse order: (1,) + (8,) = 36 bytes fill the first bucket.
        self.assertEqual([b.indices for b in buckets], [(3, 2), (1, 0)])
        self.assertEqual(buckets[0].shapes, ((1,), (8,)))
        tensors = [tf.fill(shape, float(k)) for k, shape in enumerate(shapes)]
        for bucket in buckets:
            flat = _packing.pack(tensors, bucket, "/device:CPU:0")
            for k, piece in zip(
                bucket.indices, _packing.unpack(flat, bucket, "/device:CPU:0")
            ):
                self.assertAllEqual(piece, tensors[k])


if __name__ == "__main__":
    tfdist.testing.main()
