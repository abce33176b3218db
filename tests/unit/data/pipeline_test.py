"""Internals of the sharder's tf.data graphs (tfdist.data._pipeline)."""

from __future__ import annotations

import hypothesis
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import strategies as st

import tfdist
from tfdist.data import _permutation
from tfdist.data import _pipeline
from tfdist.data import _plan

# Eager TF ops on tiny tensors: a few ms per example.
_SETTINGS = hypothesis.settings(max_examples=40, deadline=None, database=None)


class TfInt64NamespaceTest(tf.test.TestCase, parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(0, 40),
        num_replicas=st.integers(1, 4),
        batch=st.integers(1, 4),
        extra_steps=st.integers(0, 2),
        first_step=st.integers(0, 3),
    )
    def test_positions_match_numpy(
        self, num_elements, num_replicas, batch, extra_steps, first_step
    ):
        steps = -(-num_elements // (num_replicas * batch)) + extra_steps
        hypothesis.assume(first_step <= steps)
        kwargs = dict(
            num_steps=steps,
            num_replicas=num_replicas,
            first_replica=0,
            num_local_replicas=num_replicas,
            per_replica_batch_size=batch,
            first_step=first_step,
        )
        expected = _plan.pipeline_positions(num_elements=num_elements, **kwargs)
        got = _plan.pipeline_positions(
            num_elements=tf.constant(num_elements, tf.int64),
            xp=_pipeline.TF_INT64,
            **kwargs,
        )
        self.assertAllEqual(got, expected)

    @_SETTINGS
    @hypothesis.given(
        counts=st.lists(st.integers(0, 9), min_size=1, max_size=8),
        num_shards=st.integers(1, 4),
        drop=st.booleans(),
    )
    def test_shard_sizes_and_steps_match_numpy(self, counts, num_shards, drop):
        counts_array = np.array(counts, np.int64)
        sizes = _plan.round_robin_shard_sizes(counts_array, num_shards)
        tf_sizes = _plan.round_robin_shard_sizes(
            tf.constant(counts_array), num_shards, xp=_pipeline.TF_INT64
        )
        self.assertAllEqual(tf_sizes, sizes)
        self.assertEqual(
            int(
                _plan.shard_steps(
                    tf_sizes, 3, drop_remainder=drop, xp=_pipeline.TF_INT64
                )
            ),
            int(_plan.shard_steps(sizes, 3, drop_remainder=drop)),
        )

    @_SETTINGS
    @hypothesis.given(
        group_sizes=st.lists(st.integers(0, 20), min_size=1, max_size=4),
        per_step=st.integers(1, 6),
        first_step=st.integers(0, 3),
        num_steps=st.integers(0, 6),
    )
    def test_real_elements_per_step_match_numpy(
        self, group_sizes, per_step, first_step, num_steps
    ):
        steps = np.arange(first_step, first_step + num_steps)
        expected = _plan.real_elements_per_step(
            steps, group_sizes=group_sizes, per_step=per_step
        )
        got = _plan.real_elements_per_step(
            tf.range(first_step, first_step + num_steps, dtype=tf.int64),
            group_sizes=tf.constant(group_sizes, tf.int64),
            per_step=per_step,
            xp=_pipeline.TF_INT64,
        )
        self.assertAllEqual(got, expected)


class WindowRowsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        dict(testcase_name="shuffled", shuffle=True),
        dict(testcase_name="in_order", shuffle=False),
    )
    def test_rows_are_a_permutation_with_padding_last(self, shuffle):
        positions = tf.constant([[10, 11, 12], [13, 14, -1]], tf.int64)
        rows = _permutation.window_rows(
            positions,
            window_start=10,
            window_size=5,
            seed=_permutation.epoch_seed(0, 0),
            shuffle=shuffle,
        )
        self.assertAllEqual(
            np.sort(rows.numpy().reshape(-1)), [0, 1, 2, 3, 4, 5]
        )
        self.assertEqual(int(rows[1, 2]), 5)  # The zero row.

    def test_empty_positions_give_empty_rows(self):
        rows = _permutation.window_rows(
            tf.zeros([0, 2, 3], tf.int64),
            window_start=0,
            window_size=4,
            seed=_permutation.epoch_seed(0, 0),
            shuffle=True,
        )
        self.assertEqual(rows.shape, [0, 2, 3])

    def test_epoch_seeds_differ_between_epochs(self):
        self.assertNotAllEqual(
            _permutation.epoch_seed(1, 0), _permutation.epoch_seed(1, 1)
        )


class IterationsTest(tf.test.TestCase, parameterized.TestCase):
    def test_each_iterator_gets_the_next_number(self):
        schedule = _pipeline.EpochSchedule(
            seed=0,
            shuffle=True,
            first_epoch=0,
            start_step=0,
            reshuffle_each_iteration=True,
        )
        counter = _pipeline.iterations(schedule)
        self.assertAllEqual(
            [int(next(iter(counter))) for _ in range(3)], [0, 1, 2]
        )

    def test_counter_is_plain_variable_inside_strategy_scope(self):
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        schedule = _pipeline.EpochSchedule(
            seed=0,
            shuffle=True,
            first_epoch=0,
            start_step=0,
            reshuffle_each_iteration=True,
        )
        with strategy.scope():
            counter = _pipeline.iterations(schedule)
            values = [int(next(iter(counter))) for _ in range(2)]
        self.assertAllEqual(values, [0, 1])


if __name__ == "__main__":
    tfdist.testing.main()
