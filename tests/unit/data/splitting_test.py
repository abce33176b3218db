"""tfdist.data.split_batches and shard(remainder="split"): no padding rows.

Both give replicas uneven slices of a short global step and weight each
replica's rows by G * b / m. The property that makes training exact is
checked directly: Keras's default reduction (each replica divides its
weighted loss sum by its own row count, then by G; the replicas' results
are summed) equals the mean loss over the step's m rows.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import strategies as st

import tfdist
from tfdist import errors

_SETTINGS = hypothesis.settings(
    max_examples=8,
    deadline=None,
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow],
)


def _keras_step_loss(slices: list[Any], losses_of: Any, num_replicas: int) -> float:
    """sum over replicas of divide_no_nan(sum(w * loss), b) / G."""
    total = 0.0
    for x, _, w in slices:
        if len(x):
            total += float(np.sum(w * losses_of(x))) / len(x) / num_replicas
    return total


def _split_all(
    batch: tuple[np.ndarray, ...], num_pipelines: int, local_replicas: int
) -> list[list[Any]]:
    """slices[p][r]: pipeline p's local replica r, for one global batch."""
    num_replicas = num_pipelines * local_replicas
    out = []
    for pipeline_id in range(num_pipelines):
        context = tf.distribute.InputContext(num_pipelines, pipeline_id, num_replicas)
        dataset = tf.data.Dataset.from_tensors(batch)
        out.append(
            list(tfdist.data.split_batches(dataset, context).as_numpy_iterator())
        )
    return out


class SplitBatchesTest(tf.test.TestCase, parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(
        rows=st.integers(1, 40),
        num_pipelines=st.integers(1, 3),
        local_replicas=st.integers(1, 3),
    )
    def test_slices_partition_the_batch_in_keras_concat_order(
        self, rows, num_pipelines, local_replicas
    ):
        num_replicas = num_pipelines * local_replicas
        ids = np.arange(rows, dtype=np.int64)
        slices = _split_all((ids, ids * 10), num_pipelines, local_replicas)
        # Keras's _multi_worker_concat: gather worker-major, then take local
        # replica r of every worker, r = 0, 1, ...
        ordered = [slices[p][r] for r in range(local_replicas) for p in range(num_pipelines)]
        self.assertAllEqual(np.concatenate([s[0] for s in ordered]), ids)
        self.assertAllEqual(np.concatenate([s[1] for s in ordered]), ids * 10)
        sizes = [len(s[0]) for s in ordered]
        self.assertLessEqual(max(sizes) - min(sizes), 1)
        for x, _, w in ordered:
            self.assertAllClose(w, np.full(len(x), num_replicas * len(x) / rows))
        losses_of = lambda x: (x.astype(np.float64) * 0.37) ** 2 + 1.0
        self.assertAllClose(
            _keras_step_loss(ordered, losses_of, num_replicas),
            np.mean(losses_of(ids)),
            rtol=1e-6,
        )

    def test_full_batches_get_unit_weights(self):
        ids = np.arange(8, dtype=np.int64)
        slices = _split_all((ids, ids), 1, 4)
        for _, _, w in slices[0]:
            self.assertAllEqual(w, np.ones(2, np.float32))

    def test_given_sample_weight_is_multiplied(self):
        ids = np.arange(3, dtype=np.int64)
        given = np.array([1.0, 2.0, 4.0], np.float32)
        slices = _split_all((ids, ids, given), 1, 2)[0]
        # 3 rows over 2 replicas: sizes 2 and 1, factors 2*2/3 and 2*1/3.
        self.assertAllClose(slices[0][2], given[:2] * 4 / 3)
        self.assertAllClose(slices[1][2], given[2:] * 2 / 3)

    def test_inputs_alone_are_split_without_weights(self):
        dataset = tf.data.Dataset.from_tensors(np.arange(5, dtype=np.int64))
        context = tf.distribute.InputContext(1, 0, 2)
        slices = list(tfdist.data.split_batches(dataset, context).as_numpy_iterator())
        self.assertAllEqual(slices[0], [0, 1, 2])
        self.assertAllEqual(slices[1], [3, 4])

    def test_unweighted_option_gives_unit_weights(self):
        dataset = tf.data.Dataset.from_tensors((np.arange(3), np.arange(3)))
        context = tf.distribute.InputContext(1, 0, 2)
        slices = list(
            tfdist.data.split_batches(
                dataset, context, weight_uneven=False
            ).as_numpy_iterator()
        )
        self.assertAllEqual(np.concatenate([s[2] for s in slices]), np.ones(3))

    def test_unbatched_elements_raise_config_error(self):
        dataset = tf.data.Dataset.from_tensor_slices((np.arange(3), np.arange(3)))
        with self.assertRaisesRegex(errors.ConfigError, "dataset.batch"):
            tfdist.data.split_batches(dataset, None)

    def test_non_dataset_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, "tf.data.Dataset of batches"):
            tfdist.data.split_batches([1, 2, 3], None)


class TakeSlicesTest(tf.test.TestCase):
    """take_slices (one split per component) cuts as slice_bounds and take_rows do."""

    @_SETTINGS
    @hypothesis.given(
        rows=st.integers(0, 23),
        num_slices=st.integers(1, 6),
        data=st.data(),
    )
    def test_each_slice_equals_take_rows_of_its_bounds(self, rows, num_slices, data):
        indices = data.draw(st.lists(st.integers(0, num_slices - 1), min_size=1, max_size=4))
        row_lengths = data.draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows))
        batch = {
            "dense": tf.reshape(tf.range(rows * 2), [rows, 2]),
            "ragged": tf.RaggedTensor.from_row_lengths(
                tf.range(sum(row_lengths)), tf.constant(row_lengths, tf.int64)),
            "absent": None,
        }
        row_count = tf.constant(rows, tf.int64)
        got = tfdist.data.splitting.take_slices(batch, row_count, indices, num_slices)
        self.assertLen(got, len(indices))
        for index, part in zip(indices, got):
            start, size = tfdist.data.splitting.slice_bounds(row_count, index, num_slices)
            want = tfdist.data.splitting.take_rows(batch, start, size)
            self.assertIsNone(part["absent"])
            self.assertAllEqual(part["dense"], want["dense"])
            self.assertAllEqual(part["ragged"].to_list(), want["ragged"].to_list())


class ShardSplitRemainderTest(tf.test.TestCase):
    @_SETTINGS
    @hypothesis.given(
        num_elements=st.integers(1, 30),
        num_pipelines=st.integers(1, 3),
        local_replicas=st.integers(1, 2),
        per_replica=st.integers(1, 3),
        seed=st.integers(0, 2**31),
    )
    def test_each_example_once_without_padding_rows(
        self, num_elements, num_pipelines, local_replicas, per_replica, seed
    ):
        num_replicas = num_pipelines * local_replicas
        global_batch = num_replicas * per_replica
        ids = np.arange(num_elements, dtype=np.int64)
        source = tf.data.Dataset.from_tensor_slices((ids, ids * 10))
        per_pipeline = []
        for pipeline_id in range(num_pipelines):
            context = tf.distribute.InputContext(
                num_pipelines, pipeline_id, num_replicas
            )
            batches = list(
                tfdist.data.shard(
                    source,
                    context,
                    global_batch_size=global_batch,
                    seed=seed,
                    remainder="split",
                ).as_numpy_iterator()
            )
            per_pipeline.append(
                [batches[k : k + local_replicas] for k in range(0, len(batches), local_replicas)]
            )
        num_steps = -(-num_elements // global_batch)
        seen = []
        losses_of = lambda x: (x.astype(np.float64) * 0.37) ** 2 + 1.0
        for k in range(num_steps):
            step = [b for steps in per_pipeline for b in steps[k]]
            step_ids = np.concatenate([b[0] for b in step])
            self.assertAllEqual(np.concatenate([b[1] for b in step]), step_ids * 10)
            seen.append(step_ids)
            self.assertAllClose(
                _keras_step_loss(step, losses_of, num_replicas),
                np.mean(losses_of(step_ids)),
                rtol=1e-6,
            )
        self.assertAllEqual(np.sort(np.concatenate(seen)), ids)


if __name__ == "__main__":
    tfdist.testing.main()
