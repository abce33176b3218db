"""How sync mode cuts a global batch into per-worker slices."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.parameter_server import sync_runner


class SplitBatchTest(tf.test.TestCase):

    def test_slices_are_contiguous_in_order_and_as_equal_as_possible(self):
        x = tf.reshape(tf.range(14), [7, 2])
        y = tf.range(7)
        slices = sync_runner.split_batch((x, y), 3)
        self.assertEqual([int(s[1].shape[0]) for s in slices], [3, 2, 2])
        np.testing.assert_array_equal(tf.concat([s[0] for s in slices], 0), x)
        np.testing.assert_array_equal(tf.concat([s[1] for s in slices], 0), y)

    def test_fewer_examples_than_workers_gives_no_empty_slice(self):
        slices = sync_runner.split_batch(tf.range(2), 4)
        self.assertEqual([int(s.shape[0]) for s in slices], [1, 1])

    def test_none_leaves_stay_none(self):
        slices = sync_runner.split_batch((tf.range(4), None), 2)
        self.assertEqual(len(slices), 2)
        self.assertIsNone(slices[0][1])


if __name__ == "__main__":
    tf.test.main()
