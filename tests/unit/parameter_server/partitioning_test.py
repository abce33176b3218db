"""tfdist's default split of variables over ps tasks (by bytes), and the argument's forms."""

from __future__ import annotations

import tensorflow as tf
from absl.testing import absltest

import tfdist
from tfdist.parameter_server import partitioning

MIB = 1 << 20


def _shards(partitioner, rows: int, columns: int = 16) -> list[int]:
    return list(partitioner(tf.TensorShape([rows, columns]), tf.float32))


class DefaultPartitionerTest(absltest.TestCase):

    def test_a_million_row_table_is_split_once_per_ps(self):
        for num_ps in (2, 3):
            partitioner = partitioning.resolve(None, num_ps)
            self.assertEqual(_shards(partitioner, 1_000_000), [num_ps, 1])

    def test_a_shard_per_started_mib_up_to_the_ps_tasks(self):
        partitioner = partitioning.resolve(None, num_ps=4)
        rows_per_mib = MIB // (16 * 4)
        self.assertEqual(_shards(partitioner, rows_per_mib), [1, 1])  # 1 MiB: whole.
        self.assertEqual(_shards(partitioner, rows_per_mib + 1), [2, 1])
        self.assertEqual(_shards(partitioner, 3 * rows_per_mib), [3, 1])
        self.assertEqual(_shards(partitioner, 100 * rows_per_mib), [4, 1])

    def test_one_ps_task_never_splits(self):
        self.assertIsNone(partitioning.resolve(None, num_ps=1))

    def test_whole_keeps_every_variable_whole(self):
        self.assertIsNone(partitioning.resolve(partitioning.WHOLE, num_ps=2))

    def test_a_partitioner_is_used_as_given(self):
        partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(3)
        self.assertIs(partitioning.resolve(partitioner, num_ps=2), partitioner)

    def test_anything_else_raises_type_error_naming_it(self):
        with self.assertRaisesRegex(TypeError, r"'whole'.*received variable_partitioner='rows'"):
            partitioning.resolve("rows", num_ps=2)


if __name__ == "__main__":
    tfdist.testing.main()
