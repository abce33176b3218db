"""Sync mode warns where its dense sum of sparse rows changes an optimizer's update."""

from __future__ import annotations

from unittest import mock

import tensorflow as tf

from tfdist.parameter_server import sync_runner


class Adam:  # Only the class name matters to the check.
    pass


class SGD:
    pass


class LossScaleOptimizer:
    def __init__(self, inner):
        self.inner_optimizer = inner


class SparseRowsWarningTest(tf.test.TestCase):

    def _warnings(self, optimizer, indices_from_batch=True, name="token_table"):
        """The warnings logged while tracing one step's check."""
        variable = tf.Variable(tf.zeros([10, 2]), name=name)

        @tf.function
        def step(batch):
            indices = batch if indices_from_batch else tf.range(3)
            gradient = tf.IndexedSlices(tf.ones([3, 2]), indices, tf.constant([10, 2]))
            sync_runner._warn_if_rows_squared(gradient, variable, optimizer)
            return tf.constant(0)

        with mock.patch.object(sync_runner.logging, "warning") as warning:
            step(tf.constant([1, 1, 2]))
        return [call.args[0] % call.args[1:] for call in warning.call_args_list]

    def test_adam_on_rows_from_the_batch_warns_naming_variable_and_optimizer(self):
        (message,) = self._warnings(Adam(), name="adam_table")
        self.assertIn("adam_table", message)
        self.assertIn("Adam updates from the squares of sparse rows", message)
        self.assertIn("tfdist.MirroredStrategy", message)

    def test_warns_once_per_variable_and_optimizer(self):
        optimizer = Adam()
        self.assertLen(self._warnings(optimizer, name="once_table"), 1)
        self.assertEqual(self._warnings(optimizer, name="once_table"), [])

    def test_sgd_and_constant_indices_do_not_warn(self):
        self.assertEqual(self._warnings(SGD(), name="sgd_table"), [])
        self.assertEqual(self._warnings(LossScaleOptimizer(SGD()), name="scaled_sgd_table"), [])
        self.assertEqual(self._warnings(Adam(), indices_from_batch=False, name="positions"), [])


if __name__ == "__main__":
    tf.test.main()
