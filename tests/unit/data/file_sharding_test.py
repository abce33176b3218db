"""File inputs of tfdist.data.shard: the file policy and its fallbacks.

Each test writes small TFRecord files of `tf.train.Example`s with one int64
feature `id` (unique over all files) into a temporary directory.
"""

from __future__ import annotations

import os
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

# Each example writes a few files and builds a few small pipelines.
_SETTINGS = hypothesis.settings(
    max_examples=4,
    deadline=None,
    database=None,
    suppress_health_check=[
        hypothesis.HealthCheck.too_slow,
        hypothesis.HealthCheck.function_scoped_fixture,
    ],
)

_FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64)}


def _parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One record -> (x, y) = (id, 10 * id)."""
    example_id = tf.io.parse_single_example(record, _FEATURES)["id"]
    return example_id, example_id * 10


def _write_files(directory: str, counts: list[int]) -> list[str]:
    """Writes len(counts) files; file i holds counts[i] consecutive ids."""
    paths = []
    next_id = 0
    for index, count in enumerate(counts):
        path = os.path.join(directory, f"part-{index:03d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for example_id in range(next_id, next_id + count):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "id": tf.train.Feature(
                                int64_list=tf.train.Int64List(
                                    value=[example_id]
                                )
                            )
                        }
                    )
                )
                writer.write(example.SerializeToString())
        next_id += count
        paths.append(path)
    return paths


def _pipeline_outputs(
    files: list[str],
    num_pipelines: int,
    local_replicas: int,
    batch: int,
    **kwargs: Any,
) -> list[list[Any]]:
    """One iteration of every pipeline: outputs[pipeline][batch index]."""
    num_replicas = num_pipelines * local_replicas
    return [
        list(
            sharding.shard(
                files,
                tf.distribute.InputContext(num_pipelines, p, num_replicas),
                global_batch_size=num_replicas * batch,
                parse_fn=_parse,
                **kwargs,
            ).as_numpy_iterator()
        )
        for p in range(num_pipelines)
    ]


def _real_ids(batches: list[Any]) -> np.ndarray:
    if not batches:
        return np.zeros([0], np.int64)
    ids = np.concatenate([b[0] for b in batches])
    weights = np.concatenate([b[2] for b in batches])
    return ids[weights > 0]


class FilePolicyTest(tf.test.TestCase, parameterized.TestCase):
    @_SETTINGS
    @hypothesis.given(
        counts=st.lists(st.integers(0, 7), min_size=1, max_size=6),
        num_pipelines=st.integers(1, 3),
        local_replicas=st.integers(1, 2),
        batch=st.integers(1, 3),
        seed=st.integers(0, 2**31),
        epoch=st.integers(0, 3),
    )
    def test_each_record_once_and_equal_steps_over_pipelines(
        self, counts, num_pipelines, local_replicas, batch, seed, epoch
    ):
        hypothesis.assume(len(counts) >= num_pipelines and sum(counts) > 0)
        files = _write_files(self.create_tempdir().full_path, counts)
        outputs = _pipeline_outputs(
            files,
            num_pipelines,
            local_replicas,
            batch,
            seed=seed,
            epoch=epoch,
            policy="file",
        )
        self.assertLen({len(batches) for batches in outputs}, 1)
        all_ids = np.concatenate([_real_ids(batches) for batches in outputs])
        self.assertAllEqual(np.sort(all_ids), np.arange(sum(counts)))
        for batches in outputs:
            for x, y, w in batches:
                self.assertLen(x, batch)
                self.assertAllEqual(y, x * 10)
                self.assertAllEqual(x[w == 0], np.zeros_like(x[w == 0]))
        global_batch_size = num_pipelines * local_replicas * batch
        for weights in shard_testlib.step_weights(shard_testlib.global_steps(outputs, local_replicas)):
            real = weights[weights != 0]
            self.assertNotEmpty(real)  # No step is padding everywhere.
            self.assertAllEqual(
                real,
                np.full(
                    real.shape,
                    np.float32(global_batch_size) / np.float32(len(real)),
                ),
            )
            self.assertAllClose(
                weights.astype(np.float64).sum(), global_batch_size, rtol=1e-6
            )

    def test_padded_steps_weight_by_real_count_over_all_pipelines(self):
        # Pipeline 0 gets files 0 and 2 (5 + 1 = 6 records), pipeline 1
        # files 1 and 3 (2 + 1 = 3): steps of 2 per pipeline hold 2 + 2,
        # 2 + 1, then 2 + 0 real examples.
        files = _write_files(self.create_tempdir().full_path, [5, 2, 1, 1])
        outputs = _pipeline_outputs(
            files, 2, 1, 2, shuffle=False, policy="file"
        )
        weights = shard_testlib.step_weights(shard_testlib.global_steps(outputs, 1))
        self.assertLen(weights, 3)
        self.assertAllEqual(weights[0], [1, 1, 1, 1])
        third = np.float32(4) / np.float32(3)
        self.assertAllEqual(weights[1], [third, third, third, 0])
        self.assertAllEqual(weights[2], [2, 2, 0, 0])

    def test_file_policy_weights_are_mask_without_normalization(self):
        files = _write_files(self.create_tempdir().full_path, [5, 2, 1, 1])
        outputs = _pipeline_outputs(
            files,
            2,
            1,
            2,
            shuffle=False,
            policy="file",
            normalize_padded_loss=False,
        )
        weights = np.concatenate(shard_testlib.step_weights(shard_testlib.global_steps(outputs, 1)))
        self.assertAllInSet(weights, [0.0, 1.0])
        self.assertEqual(float(weights.sum()), 9)

    def test_pipeline_reads_whole_files_dealt_round_robin_without_shuffle(self):
        files = _write_files(self.create_tempdir().full_path, [2, 2, 2, 2])
        outputs = _pipeline_outputs(files, 2, 1, 2, shuffle=False)
        # Pipeline 0 gets files 0 and 2 (ids 0, 1, 4, 5), interleaved.
        self.assertAllEqual(_real_ids(outputs[0]), [0, 4, 1, 5])
        self.assertAllEqual(_real_ids(outputs[1]), [2, 6, 3, 7])

    def test_file_deal_changes_between_epochs(self):
        files = _write_files(self.create_tempdir().full_path, [3] * 6)
        first = _pipeline_outputs(files, 2, 1, 3, seed=7, epoch=0)
        second = _pipeline_outputs(files, 2, 1, 3, seed=7, epoch=1)
        self.assertNotAllEqual(
            np.sort(_real_ids(first[0])), np.sort(_real_ids(second[0]))
        )

    def test_epoch_none_reshuffles_on_each_iteration(self):
        files = _write_files(self.create_tempdir().full_path, [5, 5])
        sharded = sharding.shard(
            files, None, global_batch_size=2, parse_fn=_parse, seed=1
        )
        first = _real_ids(list(sharded.as_numpy_iterator()))
        second = _real_ids(list(sharded.as_numpy_iterator()))
        self.assertAllEqual(np.sort(first), np.sort(second))
        self.assertNotAllEqual(first, second)

    def test_start_step_resumes_uninterrupted_epoch(self):
        files = _write_files(self.create_tempdir().full_path, [5, 1, 4, 3])
        full = _pipeline_outputs(files, 2, 2, 1, seed=3, epoch=2)
        resumed = _pipeline_outputs(
            files, 2, 2, 1, seed=3, epoch=2, start_step=2
        )
        for got, expected in zip(resumed, full):
            self.assertAllEqual(got, expected[2 * 2 :])

    def test_drop_runs_smallest_shard_steps_without_weights(self):
        files = _write_files(self.create_tempdir().full_path, [4, 6, 5, 7])
        with self.assertLogs("absl", level="INFO") as logs:
            outputs = _pipeline_outputs(
                files, 2, 1, 2, remainder="drop", policy="file"
            )
        self.assertLen({len(batches) for batches in outputs}, 1)
        ids = np.concatenate([b[0] for batches in outputs for b in batches])
        self.assertLen(set(ids.tolist()), len(ids))
        self.assertLen(outputs[0][0], 2)  # (x, y): no weight added.
        self.assertIn("drops", "\n".join(logs.output))

    def test_drop_rejects_shards_that_may_have_no_full_step(self):
        files = _write_files(self.create_tempdir().full_path, [1, 9])
        with self.assertRaisesRegex(errors.ConfigError, r"only 1 records"):
            _pipeline_outputs(files, 2, 1, 2, remainder="drop", policy="file")

    def test_error_accepts_even_files(self):
        files = _write_files(self.create_tempdir().full_path, [4, 4])
        outputs = _pipeline_outputs(
            files, 2, 1, 2, remainder="error", policy="file"
        )
        ids = np.concatenate([b[0] for batches in outputs for b in batches])
        self.assertAllEqual(np.sort(ids), np.arange(8))

    def test_error_rejects_uneven_files_with_file_policy(self):
        files = _write_files(self.create_tempdir().full_path, [4, 3, 5])
        with self.assertRaisesRegex(
            errors.ConfigError, r"3 files with record counts from 3 to 5"
        ):
            _pipeline_outputs(files, 2, 1, 2, remainder="error", policy="file")


class AutoPolicyTest(tf.test.TestCase, parameterized.TestCase):
    def test_auto_chooses_file_policy_with_enough_files(self):
        files = _write_files(self.create_tempdir().full_path, [3, 3])
        with self.assertLogs("absl", level="INFO") as logs:
            _pipeline_outputs(files, 2, 1, 2)
        self.assertIn("chose 'file'", "\n".join(logs.output))

    def test_auto_chooses_element_policy_with_too_few_files(self):
        files = _write_files(self.create_tempdir().full_path, [3, 4])
        with self.assertLogs("absl", level="INFO") as logs:
            outputs = _pipeline_outputs(files, 3, 1, 1)
        self.assertIn("2 files are fewer than", "\n".join(logs.output))
        all_ids = np.concatenate([_real_ids(b) for b in outputs])
        self.assertAllEqual(np.sort(all_ids), np.arange(7))

    def test_auto_with_error_remainder_falls_back_to_element_policy(self):
        files = _write_files(self.create_tempdir().full_path, [5, 3])
        with self.assertLogs("absl", level="INFO") as logs:
            outputs = _pipeline_outputs(files, 2, 1, 2, remainder="error")
        self.assertIn("chose 'element'", "\n".join(logs.output))
        ids = np.concatenate([b[0] for batches in outputs for b in batches])
        self.assertAllEqual(np.sort(ids), np.arange(8))

    def test_file_policy_rejects_fewer_files_than_pipelines(self):
        files = _write_files(self.create_tempdir().full_path, [3, 3])
        with self.assertRaisesRegex(
            errors.ConfigError, r"received 2 files for num_input_pipelines=3"
        ):
            _pipeline_outputs(files, 3, 1, 1, policy="file")

    def test_file_policy_rejects_a_dataset(self):
        with self.assertRaisesRegex(errors.ConfigError, r"needs file paths"):
            sharding.shard(
                tf.data.Dataset.range(4),
                None,
                global_batch_size=2,
                policy="file",
            )


if __name__ == "__main__":
    tfdist.testing.main()
