"""tf-keras's listing of a split variable's shards, seen whole (`_internal/tf_keras_sharded`).

The functions behind the wrapped tf-keras methods, on TF's own
`ShardedVariable` (tf-keras itself is not imported here: the cluster test
tests/integration/parameter_server_sharded_test.py runs the wrapped
methods under both front ends).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable

from tfdist import errors
from tfdist._internal import tf_keras_sharded


class _Handler:
    """As tf-keras's `TrackableWeightHandler`: one entry of weights, several values."""

    num_tensors = 2


class _Layer:
    name = "table_layer"


def _split_table():
    shards = [tf.Variable(np.arange(6.0).reshape(3, 2)), tf.Variable(np.arange(4.0).reshape(2, 2))]
    return sharded_variable.ShardedVariable(shards), shards


class WholeTest(tf.test.TestCase):

    def test_a_complete_in_order_run_of_shards_stands_for_its_variable(self):
        table, shards = _split_table()
        bias = tf.Variable([1.0])
        self.assertEqual(
            tf_keras_sharded.whole([bias, *shards, bias]), [bias, table, bias]
        )

    def test_an_incomplete_or_reordered_run_is_left_as_it_is(self):
        _, shards = _split_table()
        self.assertEqual(tf_keras_sharded.whole(shards[:1]), shards[:1])
        self.assertEqual(tf_keras_sharded.whole(shards[::-1]), shards[::-1])


class ValuesTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.table, self.shards = _split_table()
        self.bias = tf.Variable([1.0])
        self.weights = [self.bias, *self.shards, _Handler()]
        # As tf-keras's get_weights lists them: one value per shard, two for the handler.
        self.listed = [np.array([1.0]), self.shards[0].numpy(), self.shards[1].numpy(), "a", "b"]

    def test_get_weights_joins_the_shards_rows(self):
        joined = tf_keras_sharded._joined(self.weights, self.listed)
        self.assertLen(joined, 4)
        np.testing.assert_array_equal(joined[1], self.table.numpy())
        self.assertEqual(joined[2:], ["a", "b"])

    def test_set_weights_splits_a_whole_value_by_the_shards_rows(self):
        value = np.arange(10.0).reshape(5, 2) + 100
        split = tf_keras_sharded._split(_Layer(), self.weights, [np.array([2.0]), value, "a", "b"])
        self.assertLen(split, 5)
        np.testing.assert_array_equal(split[1], value[:3])
        np.testing.assert_array_equal(split[2], value[3:])
        self.assertEqual(tf_keras_sharded._whole_count(self.weights), 4)

    def test_a_value_of_another_shape_is_refused_naming_both_shapes(self):
        with self.assertRaisesRegex(
            errors.ConfigError, r"table_layer.*shape \(4, 2\).*whole shape is \(5, 2\)"
        ):
            tf_keras_sharded._split(_Layer(), self.weights, [np.array([2.0]), np.zeros((4, 2)), "a", "b"])


if __name__ == "__main__":
    tf.test.main()
