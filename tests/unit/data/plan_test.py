"""Property tests of the sharder's pure index math (tfdist.data._plan)."""

from __future__ import annotations

import hypothesis
import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import strategies as st

import tfdist
from tfdist.data import _plan

# Pure numpy: a hundred examples take well under a second.
_SETTINGS = hypothesis.settings(max_examples=100, deadline=None, database=None)

_LAYOUTS = st.tuples(
    st.integers(1, 3),  # num_input_pipelines
    st.integers(1, 3),  # replicas per pipeline
    st.integers(1, 4),  # per-replica batch size
)


def _epoch_positions(
    num_elements: int,
    num_pipelines: int,
    local_replicas: int,
    batch: int,
    *,
    drop_remainder: bool,
) -> np.ndarray:
    """All pipelines' positions, as `[steps, replicas, batch]`."""
    num_replicas = num_pipelines * local_replicas
    steps = _plan.steps_per_epoch(
        num_elements, num_replicas * batch, drop_remainder=drop_remainder
    )
    return np.concatenate(
        [
            _plan.pipeline_positions(
                num_elements=num_elements,
                num_steps=steps,
                num_replicas=num_replicas,
                first_replica=p * local_replicas,
                num_local_replicas=local_replicas,
                per_replica_batch_size=batch,
            )
            for p in range(num_pipelines)
        ],
        axis=1,
    )


class PipelinePositionsTest(parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(num_elements=st.integers(1, 60), layout=_LAYOUTS)
    def test_every_position_once_with_padding(self, num_elements, layout):
        positions = _epoch_positions(
            num_elements, *layout, drop_remainder=False
        )
        real = positions[positions != _plan.PADDING]
        np.testing.assert_array_equal(np.sort(real), np.arange(num_elements))

    @_SETTINGS
    @hypothesis.given(num_elements=st.integers(1, 60), layout=_LAYOUTS)
    def test_padding_only_in_last_step_when_padding(self, num_elements, layout):
        positions = _epoch_positions(
            num_elements, *layout, drop_remainder=False
        )
        self.assertFalse(np.any(positions[:-1] == _plan.PADDING))
        num_padding = int(np.sum(positions[-1] == _plan.PADDING))
        self.assertEqual(num_padding, positions.size - num_elements)

    @_SETTINGS
    @hypothesis.given(num_elements=st.integers(1, 60), layout=_LAYOUTS)
    def test_tail_is_balanced_prefix_per_replica(self, num_elements, layout):
        last = _epoch_positions(num_elements, *layout, drop_remainder=False)[-1]
        is_real = last != _plan.PADDING
        counts = is_real.sum(axis=1)
        self.assertLessEqual(int(counts.max() - counts.min()), 1)
        for replica_is_real, count in zip(is_real, counts):
            self.assertTrue(np.all(replica_is_real[:count]))
            self.assertFalse(np.any(replica_is_real[count:]))

    @_SETTINGS
    @hypothesis.given(num_elements=st.integers(1, 60), layout=_LAYOUTS)
    def test_replicas_in_order_give_global_batch_in_order(
        self, num_elements, layout
    ):
        positions = _epoch_positions(
            num_elements, *layout, drop_remainder=False
        )
        flat = positions.reshape(-1)
        np.testing.assert_array_equal(
            flat[flat != _plan.PADDING], np.arange(num_elements)
        )

    @_SETTINGS
    @hypothesis.given(num_elements=st.integers(1, 60), layout=_LAYOUTS)
    def test_drop_covers_full_steps_without_padding(self, num_elements, layout):
        num_pipelines, local_replicas, batch = layout
        global_batch = num_pipelines * local_replicas * batch
        hypothesis.assume(num_elements >= global_batch)
        positions = _epoch_positions(num_elements, *layout, drop_remainder=True)
        kept = num_elements // global_batch * global_batch
        np.testing.assert_array_equal(
            np.sort(positions.reshape(-1)), np.arange(kept)
        )

    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(1, 60),
        layout=_LAYOUTS,
        data=st.data(),
    )
    def test_first_step_is_suffix_of_full_epoch(self, num_elements, layout, data):
        num_pipelines, local_replicas, batch = layout
        num_replicas = num_pipelines * local_replicas
        steps = _plan.steps_per_epoch(
            num_elements, num_replicas * batch, drop_remainder=False
        )
        # Drawn within the epoch (0 .. steps: the end of it too), not
        # filtered: most draws of a wider range would be thrown away.
        first_step = data.draw(st.integers(0, steps), label="first_step")
        kwargs = dict(
            num_elements=num_elements,
            num_steps=steps,
            num_replicas=num_replicas,
            first_replica=0,
            num_local_replicas=local_replicas,
            per_replica_batch_size=batch,
        )
        np.testing.assert_array_equal(
            _plan.pipeline_positions(first_step=first_step, **kwargs),
            _plan.pipeline_positions(**kwargs)[first_step:],
        )

    def test_steps_past_data_are_all_padding(self):
        positions = _plan.pipeline_positions(
            num_elements=3,
            num_steps=3,
            num_replicas=2,
            first_replica=0,
            num_local_replicas=2,
            per_replica_batch_size=2,
        )
        np.testing.assert_array_equal(
            positions,
            [[[0, 1], [2, -1]], [[-1, -1], [-1, -1]], [[-1, -1], [-1, -1]]],
        )


class RealElementsPerStepTest(parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(num_elements=st.integers(1, 60), layout=_LAYOUTS)
    def test_counts_real_positions_of_every_step(self, num_elements, layout):
        num_pipelines, local_replicas, batch = layout
        positions = _epoch_positions(
            num_elements, *layout, drop_remainder=False
        )
        expected = np.sum(positions != _plan.PADDING, axis=(1, 2))
        got = _plan.real_elements_per_step(
            np.arange(len(positions)),
            group_sizes=[num_elements],
            per_step=num_pipelines * local_replicas * batch,
        )
        np.testing.assert_array_equal(got, expected)

    @_SETTINGS
    @hypothesis.given(
        group_sizes=st.lists(st.integers(0, 20), min_size=1, max_size=4),
        local_replicas=st.integers(1, 3),
        batch=st.integers(1, 4),
    )
    def test_sums_every_groups_real_positions(
        self, group_sizes, local_replicas, batch
    ):
        per_step = local_replicas * batch
        steps = int(
            _plan.shard_steps(
                np.array(group_sizes), per_step, drop_remainder=False
            )
        )
        expected = np.zeros([steps], np.int64)
        for size in group_sizes:
            positions = _plan.pipeline_positions(
                num_elements=size,
                num_steps=steps,
                num_replicas=local_replicas,
                first_replica=0,
                num_local_replicas=local_replicas,
                per_replica_batch_size=batch,
            )
            expected += np.sum(positions != _plan.PADDING, axis=(1, 2))
        got = _plan.real_elements_per_step(
            np.arange(steps), group_sizes=group_sizes, per_step=per_step
        )
        np.testing.assert_array_equal(got, expected)

    def test_full_steps_then_tail_then_nothing(self):
        got = _plan.real_elements_per_step(
            np.arange(5), group_sizes=[10], per_step=4
        )
        np.testing.assert_array_equal(got, [4, 4, 2, 0, 0])


class StepsPerEpochTest(parameterized.TestCase):
    @parameterized.named_parameters(
        dict(testcase_name="even_pad", n=8, drop=False, expected=2),
        dict(testcase_name="uneven_pad", n=9, drop=False, expected=3),
        dict(testcase_name="uneven_drop", n=9, drop=True, expected=2),
        dict(testcase_name="too_small_drop", n=3, drop=True, expected=0),
    )
    def test_steps_match_expected_for_batch_four(self, n, drop, expected):
        self.assertEqual(
            _plan.steps_per_epoch(n, 4, drop_remainder=drop), expected
        )


class FileShardTest(parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(
        counts=st.lists(st.integers(0, 20), min_size=1, max_size=12),
        num_shards=st.integers(1, 5),
    )
    def test_round_robin_sizes_match_slices(self, counts, num_shards):
        counts_array = np.array(counts, np.int64)
        sizes = _plan.round_robin_shard_sizes(counts_array, num_shards)
        expected = [sum(counts[q::num_shards]) for q in range(num_shards)]
        np.testing.assert_array_equal(sizes, expected)

    @_SETTINGS
    @hypothesis.given(
        counts=st.lists(st.integers(0, 20), min_size=1, max_size=12),
        num_shards=st.integers(1, 5),
        order_seed=st.integers(0, 2**31),
    )
    def test_min_shard_size_bounds_every_deal(
        self, counts, num_shards, order_seed
    ):
        hypothesis.assume(len(counts) >= num_shards)
        order = np.random.default_rng(order_seed).permutation(len(counts))
        sizes = _plan.round_robin_shard_sizes(
            np.array(counts, np.int64)[order], num_shards
        )
        self.assertLessEqual(
            _plan.min_round_robin_shard_size(counts, num_shards),
            int(sizes.min()),
        )

    @_SETTINGS
    @hypothesis.given(
        counts=st.lists(st.integers(0, 20), min_size=1, max_size=12),
        num_shards=st.integers(1, 5),
    )
    def test_min_shard_size_is_reached_by_some_deal(self, counts, num_shards):
        # The bound is tight: deal the smallest files to the last shard,
        # which gets len(counts) // num_shards files in a round robin.
        hypothesis.assume(len(counts) >= num_shards)
        per_shard = len(counts) // num_shards
        ascending = sorted(counts)
        order = ascending[per_shard:]
        last = num_shards - 1
        for i, count in enumerate(ascending[:per_shard]):
            order.insert(last + i * num_shards, count)
        sizes = _plan.round_robin_shard_sizes(np.array(order, np.int64), num_shards)
        self.assertEqual(
            _plan.min_round_robin_shard_size(counts, num_shards), int(sizes.min())
        )

    @parameterized.named_parameters(
        dict(testcase_name="pad_uses_largest", drop=False, expected=3),
        dict(testcase_name="drop_uses_smallest", drop=True, expected=1),
    )
    def test_shard_steps_for_sizes_four_and_ten(self, drop, expected):
        steps = _plan.shard_steps(np.array([4, 10]), 4, drop_remainder=drop)
        self.assertEqual(int(steps), expected)


class ReplicaLayoutTest(absltest.TestCase):
    def test_derived_sizes_for_two_pipelines_of_two_replicas(self):
        layout = _plan.ReplicaLayout(
            num_replicas_in_sync=4,
            num_input_pipelines=2,
            input_pipeline_id=1,
            per_replica_batch_size=3,
        )
        self.assertEqual(layout.num_local_replicas, 2)
        self.assertEqual(layout.first_replica, 2)
        self.assertEqual(layout.global_batch_size, 12)
        self.assertEqual(layout.pipeline_batch_size, 6)


if __name__ == "__main__":
    tfdist.testing.main()
