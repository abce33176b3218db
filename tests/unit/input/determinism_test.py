"""What makes copies of a pipeline differ across workers, and the shuffle-seed fix."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist import errors
from tfdist._internal import tf_data
from tfdist.data.distributed import determinism
from tfdist.data.distributed import distribute
from tfdist.data.distributed import split

_DATA = np.arange(40, dtype=np.int64)


def _generator():
    yield from _DATA


class _UnseededTestCase(tf.test.TestCase, parameterized.TestCase):
    """tf.test.TestCase sets a global seed, which seeds every shuffle: undo it."""

    def setUp(self):
        super().setUp()
        tf.random.set_seed(None)


def _findings(dataset: tf.data.Dataset) -> list[str]:
    return sorted(str(f) for f in determinism.find_nondeterminism(tf_data.pipeline_graph(dataset)))


def _epochs(dataset: tf.data.Dataset, count: int) -> list[list[int]]:
    """Examples of `count` passes over one dataset object (batches flattened)."""
    return [[int(v) for batch in dataset for v in batch.numpy()] for _ in range(count)]


class FindNondeterminismTest(_UnseededTestCase):
    @parameterized.named_parameters(
        dict(testcase_name="plain", make=lambda d: d.batch(4)),
        dict(testcase_name="seeded_shuffle", make=lambda d: d.shuffle(40, seed=3).batch(4)),
        dict(testcase_name="stateless_random_map",
             make=lambda d: d.map(lambda v: v + tf.cast(tf.random.stateless_uniform([], seed=[1, 2]) > 2, tf.int64)).batch(4)),
        dict(testcase_name="cache_repeat_interleave",
             make=lambda d: d.cache().repeat(2).interleave(lambda v: tf.data.Dataset.from_tensors(v), cycle_length=2).batch(4)),
        dict(testcase_name="tfdist_shard",
             make=lambda d: tfdist.data.shard(d.map(lambda v: (v, v)), None, global_batch_size=4, seed=1)),
    )
    def test_deterministic_pipelines_have_no_findings(self, make):
        self.assertEqual(_findings(make(tf.data.Dataset.from_tensor_slices(_DATA))), [])

    @parameterized.named_parameters(
        dict(testcase_name="unseeded_shuffle", make=lambda d: d.shuffle(40), expected=["ShuffleDatasetV3 (unseeded)"]),
        dict(testcase_name="random_map",
             make=lambda d: d.map(lambda v: v + tf.cast(tf.random.uniform([]) > 2, tf.int64)),
             expected=["RandomUniform (unseeded)"]),
        dict(testcase_name="nondeterministic_parallel_map",
             make=lambda d: d.map(lambda v: v, num_parallel_calls=2, deterministic=False),
             expected=["ParallelMapDatasetV2 (deterministic=False)"]),
        dict(testcase_name="python_function",
             make=lambda d: d.map(lambda v: tf.py_function(lambda x: x, [v], tf.int64)),
             expected=["EagerPyFunc (runs Python)"]),
    )
    def test_what_differs_between_copies_is_named(self, make, expected):
        self.assertEqual(_findings(make(tf.data.Dataset.from_tensor_slices(_DATA)).batch(4)), expected)

    def test_generator_pipeline_runs_python(self):
        dataset = tf.data.Dataset.from_generator(
            _generator, output_signature=tf.TensorSpec([], tf.int64))
        self.assertIn("GeneratorDataset (runs Python)", _findings(dataset))

    def test_options_that_allow_reordering_are_named(self):
        options = tf.data.Options()
        options.deterministic = False
        dataset = tf.data.Dataset.from_tensor_slices(_DATA).with_options(options)
        self.assertEqual(_findings(dataset), ["OptionsDataset (Options(deterministic=False))"])

    def test_only_a_top_level_unseeded_shuffle_is_fixable(self):
        graph = tf_data.pipeline_graph(
            tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).map(
                lambda v: v + tf.cast(tf.random.uniform([]) > 2, tf.int64)))
        fixable = {f.op: f.fixable for f in determinism.find_nondeterminism(graph)}
        self.assertEqual(fixable, {"ShuffleDatasetV3": True, "RandomUniform": False})


class SeedShufflesTest(_UnseededTestCase):
    def _seeded(self, dataset: tf.data.Dataset, seed: int) -> tf.data.Dataset:
        return determinism.seed_shuffles(dataset, tf_data.pipeline_graph(dataset), seed)

    def test_copies_with_one_seed_agree_and_reshuffle_every_epoch(self):
        dataset = tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).batch(8)
        first, second = self._seeded(dataset, 11), self._seeded(dataset, 11)
        epochs = _epochs(first, 3)
        self.assertEqual(_epochs(second, 3), epochs)
        for epoch in epochs:
            self.assertEqual(sorted(epoch), _DATA.tolist())
        self.assertNotEqual(epochs[0], epochs[1])

    def test_the_copy_has_no_findings_left(self):
        dataset = tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).batch(8)
        self.assertEqual(_findings(self._seeded(dataset, 5)), [])

    def test_tfdist_input_reshuffles_the_copy_every_epoch(self):
        # tfdist's distributed dataset builds its pipeline on the copy once
        # and starts one iterator over it per pass.
        seeded = self._seeded(tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).batch(8), 3)
        layout = split.InputLayout(num_replicas_in_sync=1, num_workers=1, worker_index=0)
        distributed = distribute.distribute_dataset(seeded, layout)
        epochs = [
            [int(v) for element in distributed for v in element.values[0].numpy()]
            for _ in range(2)
        ]
        self.assertEqual(sorted(epochs[0]), _DATA.tolist())
        self.assertNotEqual(epochs[0], epochs[1])

    def test_different_seeds_give_different_orders(self):
        dataset = tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).batch(8)
        self.assertNotEqual(_epochs(self._seeded(dataset, 1), 1), _epochs(self._seeded(dataset, 2), 1))


class _FixedSeed:
    """Stands in for the cluster's ChiefInputService: one agreed seed."""

    def agreed_seed(self) -> int:
        return 1234


class AgreeingDatasetFnTest(_UnseededTestCase):
    def _shards(self, dataset_fn, num_workers: int = 2) -> list[list[int]]:
        agreeing = distribute.agreeing_dataset_fn(dataset_fn, _FixedSeed())
        return [
            [int(v) for v in agreeing(tf.distribute.InputContext(num_workers, w, num_workers))]
            for w in range(num_workers)
        ]

    def test_shuffle_before_shard_partitions_the_data_every_epoch(self):
        def dataset_fn(context):
            return tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).shard(
                context.num_input_pipelines, context.input_pipeline_id)

        agreeing = distribute.agreeing_dataset_fn(dataset_fn, _FixedSeed())
        shards = [agreeing(tf.distribute.InputContext(2, w, 2)) for w in range(2)]
        epochs = [[int(v) for shard in shards for v in shard] for _ in range(2)]
        for epoch in epochs:
            self.assertEqual(sorted(epoch), _DATA.tolist())
        self.assertNotEqual(epochs[0], epochs[1])

    def test_shuffle_built_outside_dataset_fn_is_seeded_too(self):
        shuffled = tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40)

        def dataset_fn(context):
            return shuffled.shard(context.num_input_pipelines, context.input_pipeline_id)

        shards = self._shards(dataset_fn)
        self.assertEqual(sorted(shards[0] + shards[1]), _DATA.tolist())

    def test_the_users_global_seed_is_left_as_it_was(self):
        def dataset_fn(context):
            return tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).shard(2, 0)

        self._shards(dataset_fn)
        unseeded = tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40)
        self.assertEqual(_findings(unseeded), ["ShuffleDatasetV3 (unseeded)"])

    def test_python_before_shard_is_refused_naming_the_fix(self):
        def dataset_fn(context):
            return tf.data.Dataset.from_generator(
                _generator, output_signature=tf.TensorSpec([], tf.int64)).shard(
                context.num_input_pipelines, context.input_pipeline_id)

        with self.assertRaisesRegex(errors.ConfigError, r"GeneratorDataset \(runs Python\).*Shard first"):
            self._shards(dataset_fn)

    def test_random_steps_after_the_shard_are_left_alone(self):
        def dataset_fn(context):
            return tf.data.Dataset.from_tensor_slices(_DATA).shard(
                context.num_input_pipelines, context.input_pipeline_id).map(
                lambda v: v + tf.cast(tf.random.uniform([]) > 2, tf.int64))

        shards = self._shards(dataset_fn)
        self.assertEqual(sorted(shards[0] + shards[1]), _DATA.tolist())


class ShardOptionsAcrossWorkersTest(_UnseededTestCase):
    """With `shard_options`, each worker reads its own copy of the pipeline to shard it."""

    def _worker_datasets(self, dataset: tf.data.Dataset) -> list:
        options = tfdist.data.ShardOptions(seed=7)
        return [
            distribute.distribute_dataset(
                dataset, split.InputLayout(num_replicas_in_sync=2, num_workers=2, worker_index=w),
                shard_options=options, chief_service=_FixedSeed())
            for w in range(2)
        ]

    def test_an_unseeded_shuffle_upstream_still_partitions_every_epoch(self):
        # Without an agreed seed, each copy would be read into memory in its
        # own shuffled order, and the shard permutations would index
        # different data on each worker.
        dataset = tf.data.Dataset.from_tensor_slices(_DATA).shuffle(40).batch(8)
        workers = self._worker_datasets(dataset)
        for _ in range(2):
            seen = [int(v) for distributed in workers for element in distributed
                    for v in element.values[0].numpy()]
            self.assertEqual(sorted(seen), _DATA.tolist())

    def test_a_pipeline_that_cannot_agree_is_refused_naming_the_fix(self):
        dataset = tf.data.Dataset.from_generator(
            _generator, output_signature=tf.TensorSpec([], tf.int64)).batch(8)
        with self.assertRaisesRegex(errors.ConfigError, r"shard_options.*GeneratorDataset.*drop shard_options"):
            self._worker_datasets(dataset)


if __name__ == "__main__":
    tfdist.testing.main()
