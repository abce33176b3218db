"""Element-policy behaviour of tfdist.data.shard, checked on every layout.

Each test builds the shard of every input pipeline in one process, with
`tf.distribute.InputContext(num_input_pipelines, input_pipeline_id,
num_replicas_in_sync)`, and reassembles global steps from them: step k is
the per-replica batches of pipeline 0, then pipeline 1, ...
"""

from __future__ import annotations

import gc
from typing import Any

import hypothesis
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import strategies as st

import tfdist
from tfdist import errors
from tfdist.data import sharding
from tests.unit.data import shard_testlib

# Each example builds and reads a few small tf.data pipelines (~0.3 s each
# on 2 cores); a handful of examples per property keeps the file near 30 s.
_SETTINGS = hypothesis.settings(
    max_examples=5,
    deadline=None,
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)

_LAYOUTS = st.tuples(
    st.integers(1, 3),  # num_input_pipelines (workers)
    st.integers(1, 2),  # replicas per pipeline
    st.integers(1, 3),  # per-replica batch size
)


def _dataset(num_elements: int) -> tf.data.Dataset:
    """(x, y) with x = example id and y = 10 * id, so rows can be checked."""
    ids = np.arange(num_elements, dtype=np.int64)
    return tf.data.Dataset.from_tensor_slices((ids, ids * 10))


def _one_iteration(dataset: tf.data.Dataset) -> list[Any]:
    return list(dataset.as_numpy_iterator())


def _global_steps(
    source: tf.data.Dataset,
    layout: tuple[int, int, int],
    **kwargs: Any,
) -> list[list[Any]]:
    """One iteration of every pipeline, as steps[k][global replica]."""
    num_pipelines, local_replicas, batch = layout
    num_replicas = num_pipelines * local_replicas
    per_pipeline = [
        _one_iteration(
            sharding.shard(
                source,
                tf.distribute.InputContext(num_pipelines, pipeline_id, num_replicas),
                global_batch_size=num_replicas * batch,
                **kwargs,
            )
        )
        for pipeline_id in range(num_pipelines)
    ]
    return shard_testlib.global_steps(per_pipeline, local_replicas)


def _ids_and_weights(steps: list[list[Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Flattened example ids and weights, in step then replica order."""
    ids = np.concatenate([b[0] for step in steps for b in step])
    weights = np.concatenate([b[2] for step in steps for b in step])
    return ids, weights


def _real_order(steps: list[list[Any]]) -> np.ndarray:
    ids, weights = _ids_and_weights(steps)
    return ids[weights > 0]


def _expected_real_per_step(num_elements: int, global_batch_size: int):
    """M_k of the element policy: full steps, then the tail."""
    num_steps = -(-num_elements // global_batch_size)
    return [
        min(global_batch_size, num_elements - k * global_batch_size)
        for k in range(num_steps)
    ]


class ExactlyOnceTest(tf.test.TestCase, parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(1, 30),
        layout=_LAYOUTS,
        seed=st.integers(0, 2**31),
        epoch=st.integers(0, 3),
    )
    def test_each_example_once_per_epoch_with_step_normalized_weights(
        self, num_elements, layout, seed, epoch
    ):
        steps = _global_steps(
            _dataset(num_elements), layout, seed=seed, epoch=epoch
        )
        ids, weights = _ids_and_weights(steps)
        self.assertAllEqual(np.sort(ids[weights > 0]), np.arange(num_elements))
        global_batch_size = len(steps[0]) * len(steps[0][0][0])
        self.assertLen(steps, -(-num_elements // global_batch_size))
        for step in steps[:-1]:  # Padding only in the last global step.
            for _, _, w in step:
                self.assertAllEqual(w, np.ones_like(w))
        for step in steps:
            for x, y, w in step:
                self.assertAllEqual(y, x * 10)  # Rows stay whole.
                self.assertAllEqual(x[w == 0], np.zeros_like(x[w == 0]))
        # Weights: B / M_k on the M_k real examples of step k, exactly 0 on
        # padding, so every step's weights sum to the global batch.
        expected_real = _expected_real_per_step(num_elements, global_batch_size)
        for weights, num_real in zip(shard_testlib.step_weights(steps), expected_real):
            self.assertEqual(weights.dtype, np.float32)
            real = weights[weights != 0]
            self.assertLen(real, num_real)
            self.assertAllEqual(
                real,
                np.full(
                    [num_real],
                    np.float32(global_batch_size) / np.float32(num_real),
                ),
            )
            self.assertAllClose(
                weights.astype(np.float64).sum(), global_batch_size, rtol=1e-6
            )

    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(1, 30),
        layout=_LAYOUTS,
        seed=st.integers(0, 2**31),
    )
    def test_weights_are_mask_without_normalization(
        self, num_elements, layout, seed
    ):
        steps = _global_steps(
            _dataset(num_elements),
            layout,
            seed=seed,
            normalize_padded_loss=False,
        )
        ids, weights = _ids_and_weights(steps)
        self.assertAllEqual(np.sort(ids[weights > 0]), np.arange(num_elements))
        self.assertAllInSet(weights, [0.0, 1.0])
        self.assertEqual(float(weights.sum()), num_elements)

    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(1, 30),
        layout=_LAYOUTS,
        seed=st.integers(0, 2**31),
        epoch=st.integers(0, 3),
    )
    def test_pipelines_match_single_pipeline_with_same_replicas(
        self, num_elements, layout, seed, epoch
    ):
        num_pipelines, local_replicas, batch = layout
        hypothesis.assume(num_pipelines > 1)
        dataset = _dataset(num_elements)
        many = _global_steps(dataset, layout, seed=seed, epoch=epoch)
        one = _global_steps(
            dataset,
            (1, num_pipelines * local_replicas, batch),
            seed=seed,
            epoch=epoch,
        )
        self.assertAllEqual(_ids_and_weights(many), _ids_and_weights(one))

    def test_different_seeds_give_different_orders(self):
        dataset = _dataset(20)
        first = _global_steps(dataset, (1, 1, 4), seed=1)
        second = _global_steps(dataset, (1, 1, 4), seed=2)
        self.assertNotAllEqual(_real_order(first), _real_order(second))

    def test_shuffle_false_keeps_input_order(self):
        steps = _global_steps(_dataset(11), (2, 2, 1), shuffle=False)
        self.assertAllEqual(_real_order(steps), np.arange(11))


class ResumptionTest(tf.test.TestCase, parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(1, 30),
        layout=_LAYOUTS,
        seed=st.integers(0, 2**31),
        epoch=st.integers(0, 3),
        data=st.data(),
    )
    def test_start_step_resumes_uninterrupted_epoch(
        self, num_elements, layout, seed, epoch, data
    ):
        num_pipelines, local_replicas, batch = layout
        num_replicas = num_pipelines * local_replicas
        context = tf.distribute.InputContext(
            num_pipelines,
            data.draw(st.integers(0, num_pipelines - 1), label="pipeline"),
            num_replicas,
        )
        kwargs = dict(
            global_batch_size=num_replicas * batch, seed=seed, epoch=epoch
        )
        dataset = _dataset(num_elements)
        full = _one_iteration(sharding.shard(dataset, context, **kwargs))
        num_steps = len(full) // local_replicas
        start_step = data.draw(st.integers(0, num_steps), label="start_step")
        resumed = _one_iteration(
            sharding.shard(dataset, context, start_step=start_step, **kwargs)
        )
        self.assertLen(resumed, len(full) - start_step * local_replicas)
        for got, expected in zip(resumed, full[start_step * local_replicas :]):
            self.assertAllEqual(got, expected)

    def test_second_iteration_after_resume_is_next_full_epoch(self):
        dataset = _dataset(10)
        resumed = sharding.shard(
            dataset, None, global_batch_size=4, epoch=2, start_step=1
        )
        _one_iteration(resumed)
        next_epoch = _one_iteration(resumed)
        expected = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, epoch=3)
        )
        self.assertAllEqual(next_epoch, expected)


class EpochCounterTest(tf.test.TestCase, parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(10, 30),
        layout=_LAYOUTS,
        seed=st.integers(0, 2**31),
    )
    def test_consecutive_iterations_are_different_epochs(
        self, num_elements, layout, seed
    ):
        # The whole epoch (every pipeline's share, in order) is compared: one
        # pipeline's few elements can repeat their order by chance (about
        # 1 in 720 for 3 of 10 elements, and hypothesis found such a seed),
        # a permutation of all >= 10 elements only 1 in 10! times.
        num_pipelines, local_replicas, batch = layout
        num_replicas = num_pipelines * local_replicas
        epochs = [[], []]
        for pipeline in range(num_pipelines):
            sharded = sharding.shard(
                _dataset(num_elements),
                tf.distribute.InputContext(num_pipelines, pipeline, num_replicas),
                global_batch_size=num_replicas * batch,
                seed=seed,
            )
            for epoch in epochs:
                epoch.extend(b[0] for b in _one_iteration(sharded))
        self.assertNotAllEqual(np.concatenate(epochs[0]), np.concatenate(epochs[1]))

    def test_epoch_none_reshuffles_on_each_iteration(self):
        dataset = _dataset(20)
        sharded = sharding.shard(dataset, None, global_batch_size=4, seed=3)
        first = _one_iteration(sharded)
        gc.collect()  # The counter must outlive the Python call.
        second = _one_iteration(sharded)
        self.assertNotAllEqual(first, second)
        for epoch, got in enumerate((first, second)):
            expected = _one_iteration(
                sharding.shard(
                    dataset,
                    None,
                    global_batch_size=4,
                    seed=3,
                    epoch=epoch,
                    reshuffle_each_iteration=False,
                )
            )
            self.assertAllEqual(got, expected)

    def test_each_pass_of_repeat_is_the_next_epoch(self):
        dataset = _dataset(10)
        repeated = list(
            sharding.shard(dataset, None, global_batch_size=4, seed=3)
            .repeat(2)
            .as_numpy_iterator()
        )
        expected = [
            batch
            for epoch in (0, 1)
            for batch in _one_iteration(
                sharding.shard(
                    dataset, None, global_batch_size=4, seed=3, epoch=epoch
                )
            )
        ]
        self.assertAllEqual(repeated, expected)

    def test_integer_epoch_counts_on_from_there(self):
        dataset = _dataset(12)
        sharded = sharding.shard(dataset, None, global_batch_size=4, epoch=5)
        _one_iteration(sharded)
        expected = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, epoch=6)
        )
        self.assertAllEqual(_one_iteration(sharded), expected)

    def test_epoch_none_without_shuffle_repeats_the_same_batches(self):
        sharded = sharding.shard(
            _dataset(10),
            tf.distribute.InputContext(1, 0, 2),
            global_batch_size=4,
            shuffle=False,
        )
        first = _one_iteration(sharded)
        self.assertAllEqual(_one_iteration(sharded), first)
        self.assertAllEqual(
            np.concatenate([b[0] for b in first]),
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 9, 0],
        )

    def test_no_reshuffle_replays_the_same_epoch(self):
        sharded = sharding.shard(
            _dataset(12),
            None,
            global_batch_size=4,
            reshuffle_each_iteration=False,
        )
        self.assertAllEqual(_one_iteration(sharded), _one_iteration(sharded))


class RemainderTest(tf.test.TestCase, parameterized.TestCase):
    def test_drop_keeps_full_steps_without_weights(self):
        steps = _global_steps(_dataset(11), (2, 1, 2), remainder="drop")
        self.assertLen(steps, 2)
        ids = np.concatenate([b[0] for step in steps for b in step])
        self.assertLen(set(ids.tolist()), 8)
        self.assertLen(steps[0][0], 2)  # (x, y): no weight added.

    def test_drop_logs_dropped_count(self):
        with self.assertLogs("absl", level="INFO") as logs:
            sharding.shard(
                _dataset(11), None, global_batch_size=4, remainder="drop"
            )
        self.assertIn("drops 3 of 11 examples", "\n".join(logs.output))

    def test_error_accepts_divisible_size(self):
        steps = _global_steps(_dataset(12), (2, 1, 3), remainder="error")
        ids = np.concatenate([b[0] for step in steps for b in step])
        self.assertAllEqual(np.sort(ids), np.arange(12))

    def test_error_rejects_indivisible_size_naming_both(self):
        with self.assertRaisesRegex(
            errors.ConfigError, r"dataset size 10 .*global_batch_size=4"
        ):
            sharding.shard(
                _dataset(10), None, global_batch_size=4, remainder="error"
            )

    def test_drop_rejects_dataset_smaller_than_global_batch(self):
        with self.assertRaisesRegex(errors.ConfigError, r"dataset size 3"):
            sharding.shard(
                _dataset(3), None, global_batch_size=4, remainder="drop"
            )

    def test_existing_sample_weight_is_multiplied_by_step_scale(self):
        ids = np.arange(5, dtype=np.int64)
        dataset = tf.data.Dataset.from_tensor_slices(
            (ids, ids, np.full([5], 2.0, np.float32))
        )
        batches = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, shuffle=False)
        )
        self.assertAllEqual(batches[0][2], [2.0, 2.0, 2.0, 2.0])
        # Step 1 holds 1 real example of 4: scale 4 / 1.
        self.assertAllEqual(batches[1][2], [8.0, 0.0, 0.0, 0.0])

    def test_existing_sample_weight_is_multiplied_by_mask_unnormalized(self):
        ids = np.arange(5, dtype=np.int64)
        dataset = tf.data.Dataset.from_tensor_slices(
            (ids, ids, np.full([5], 2.0, np.float32))
        )
        batches = _one_iteration(
            sharding.shard(
                dataset,
                None,
                global_batch_size=4,
                shuffle=False,
                normalize_padded_loss=False,
            )
        )
        self.assertAllEqual(batches[1][2], [2.0, 0.0, 0.0, 0.0])

    def test_integer_sample_weight_becomes_float32_when_normalized(self):
        ids = np.arange(6, dtype=np.int64)
        dataset = tf.data.Dataset.from_tensor_slices(
            (ids, ids, np.full([6], 3, np.int32))
        )
        batches = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, shuffle=False)
        )
        self.assertEqual(batches[1][2].dtype, np.float32)
        self.assertAllEqual(batches[1][2], [6.0, 6.0, 0.0, 0.0])

    def test_float64_sample_weight_keeps_its_dtype(self):
        ids = np.arange(7, dtype=np.int64)
        dataset = tf.data.Dataset.from_tensor_slices(
            (ids, ids, np.ones([7], np.float64))
        )
        batches = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, shuffle=False)
        )
        self.assertEqual(batches[1][2].dtype, np.float64)
        self.assertAllEqual(batches[1][2], [4 / 3, 4 / 3, 4 / 3, 0.0])

    def test_per_timestep_sample_weight_is_scaled_per_example(self):
        ids = np.arange(3, dtype=np.int64)
        dataset = tf.data.Dataset.from_tensor_slices(
            (ids, ids, np.ones([3, 2], np.float32))
        )
        ((_, _, w),) = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, shuffle=False)
        )
        scale = np.float32(4) / np.float32(3)
        self.assertAllEqual(w, [[scale] * 2] * 3 + [[0.0, 0.0]])

    def test_dict_features_are_padded_with_zeros(self):
        ids = np.arange(3, dtype=np.float32)
        dataset = tf.data.Dataset.from_tensor_slices(
            ({"a": ids, "b": np.stack([ids, ids], axis=1)}, ids)
        )
        ((x, _, w),) = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, shuffle=False)
        )
        self.assertAllEqual(x["b"], [[0, 0], [1, 1], [2, 2], [0, 0]])
        self.assertAllEqual(w, [np.float32(4) / np.float32(3)] * 3 + [0])

    def test_single_tensor_elements_work_when_dropping(self):
        dataset = tf.data.Dataset.range(9)
        batches = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, remainder="drop")
        )
        self.assertLen(batches, 2)


class InputKindsTest(tf.test.TestCase, parameterized.TestCase):
    @hypothesis.settings(_SETTINGS, max_examples=3)
    @hypothesis.given(
        num_elements=st.integers(1, 30),
        layout=_LAYOUTS,
        seed=st.integers(0, 2**31),
    )
    def test_streaming_windows_keep_exactly_once_and_agreement(
        self, num_elements, layout, seed
    ):
        num_pipelines, local_replicas, batch = layout
        dataset = _dataset(num_elements)
        # Elements are 16 bytes: a budget just under the dataset's size
        # streams it in windows of about half of it.
        budget = 16 * num_elements - 1
        many = _global_steps(
            dataset, layout, seed=seed, max_in_memory_bytes=budget
        )
        one = _global_steps(
            dataset,
            (1, num_pipelines * local_replicas, batch),
            seed=seed,
            max_in_memory_bytes=budget,
        )
        ids, weights = _ids_and_weights(many)
        self.assertAllEqual(np.sort(ids[weights > 0]), np.arange(num_elements))
        self.assertAllEqual(_ids_and_weights(many), _ids_and_weights(one))
        global_batch_size = num_pipelines * local_replicas * batch
        for weights, num_real in zip(
            shard_testlib.step_weights(many),
            _expected_real_per_step(num_elements, global_batch_size),
        ):
            self.assertAllEqual(
                weights[weights != 0],
                np.full(
                    [num_real],
                    np.float32(global_batch_size) / np.float32(num_real),
                ),
            )

    def test_streaming_single_window_matches_in_memory(self):
        dataset = _dataset(7)
        # 7 elements, global batch 8: one window whatever the byte budget.
        streamed = _global_steps(dataset, (2, 1, 4), max_in_memory_bytes=2)
        in_memory = _global_steps(dataset, (2, 1, 4))
        self.assertAllEqual(
            _ids_and_weights(streamed), _ids_and_weights(in_memory)
        )

    def test_unknown_cardinality_is_counted_and_logged(self):
        dataset = _dataset(20).filter(lambda x, y: x % 2 == 0)
        with self.assertLogs("absl", level="INFO") as logs:
            sharded = sharding.shard(dataset, None, global_batch_size=4)
        self.assertIn("counted 10 elements", "\n".join(logs.output))
        steps = _one_iteration(sharded)
        self.assertLen(steps, 3)

    def test_cardinality_is_steps_with_one_local_replica(self):
        sharded = sharding.shard(
            _dataset(10),
            tf.distribute.InputContext(2, 1, 2),
            global_batch_size=4,
        )
        self.assertEqual(int(sharded.cardinality()), 3)

    def test_cardinality_is_unknown_with_two_local_replicas(self):
        # TF's DistributedDatasetsFromFunction would read 6 batches as 6 steps.
        sharded = sharding.shard(
            _dataset(10),
            tf.distribute.InputContext(1, 0, 2),
            global_batch_size=4,
        )
        self.assertEqual(
            int(sharded.cardinality()), tf.data.UNKNOWN_CARDINALITY
        )

    def test_string_features_are_padded_with_empty_strings(self):
        dataset = tf.data.Dataset.from_tensor_slices(
            (["a", "b", "c"], [1, 2, 3])
        )
        ((x, _, _),) = _one_iteration(
            sharding.shard(dataset, None, global_batch_size=4, shuffle=False)
        )
        self.assertAllEqual(x, [b"a", b"b", b"c", b""])


if __name__ == "__main__":
    tfdist.testing.main()
