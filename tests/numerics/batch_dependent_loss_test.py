"""What each strategy computes for a loss that depends on how the batch is grouped.

`add_loss(reduce_sum(...))` (the Keras training guide's
`ActivityRegularizationLayer`) is a sum over the rows a call sees. One
device's call sees the global batch; a replica sees its share, a
LayerPlacement microbatch its share. Keras scales each call's total loss
for the sum of gradients over replicas (or the mean over microbatches), so
under every strategy the added loss, logged and trained, is 1/N of one
device's (N replicas, or M microbatches): TF's MirroredStrategy and
tfdist's alike, both front ends. A mean (`reduce_mean`) is independent of
the grouping, and equal. docs/drop_in.md states this for users.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

from tests.conformance import harness

pytestmark = pytest.mark.model
keras = tf.keras

NUM_EXAMPLES = 64
#: The rows of one step split N = 4 ways under every strategy here (4
#: replicas, or 4 microbatches).
N = harness.NUM_REPLICAS
CONTENDERS = ("tf", "tfdist", "tfdist_layer_placement")
#: A step is read as the new kernel minus its initial 1.0: each stored
#: weight is rounded to float32 near 1, so two steps that agree differ by up
#: to one unit in the last place of 1.0 (plus summation order); the steps
#: compared are ~1e-3, and a factor N off would differ by ~75 % of that.
STEP_ATOL = 2 * float(np.finfo(np.float32).eps)


class SumOfRows(keras.layers.Layer):
    def call(self, inputs):
        self.add_loss(tf.reduce_sum(inputs) * 0.1)
        return inputs


class MeanOfRows(keras.layers.Layer):
    def call(self, inputs):
        self.add_loss(tf.reduce_mean(inputs) * 0.1)
        return inputs


def _one_step(contender: str, loss_layer: type) -> tuple[float, np.ndarray]:
    """The logged loss and the first kernel's change after one step of the whole data."""
    x = np.random.default_rng(0).normal(size=(NUM_EXAMPLES, 4)).astype("float32")
    y = np.zeros((NUM_EXAMPLES, 1), "float32")
    with harness.make_strategy(contender).scope():
        inputs = keras.Input((4,))
        hidden = loss_layer()(keras.layers.Dense(3, kernel_initializer="ones")(inputs))
        model = keras.Model(inputs, keras.layers.Dense(1, kernel_initializer="zeros")(hidden))
        model.compile(keras.optimizers.SGD(0.01), "mse")
    history = model.fit(x, y, batch_size=NUM_EXAMPLES, epochs=1, shuffle=False, verbose=0)
    return history.history["loss"][0], model.get_weights()[0] - 1.0


class BatchDependentLossTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.results = {
            (layer.__name__, contender): _one_step(contender, layer)
            for layer in (SumOfRows, MeanOfRows)
            for contender in ("one_device",) + CONTENDERS
            if contender != "tf" or harness.TF_CONTENDER
        }

    @parameterized.parameters(*CONTENDERS)
    def test_a_sum_over_the_batch_is_one_nth_of_one_devices(self, contender):
        harness.skip_unless_run(self, contender)
        # The targets are 0 and the last layer's kernel starts at 0: the only
        # loss, and the first kernel's only gradient, is the added one.
        loss, step = self.results["SumOfRows", contender]
        reference_loss, reference_step = self.results["SumOfRows", "one_device"]
        np.testing.assert_allclose(loss, reference_loss / N, rtol=1e-5)
        np.testing.assert_allclose(step, reference_step / N, rtol=1e-5, atol=STEP_ATOL)

    @parameterized.parameters(*CONTENDERS)
    def test_a_mean_over_the_batch_is_one_devices(self, contender):
        harness.skip_unless_run(self, contender)
        loss, step = self.results["MeanOfRows", contender]
        reference_loss, reference_step = self.results["MeanOfRows", "one_device"]
        np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
        np.testing.assert_allclose(step, reference_step, rtol=1e-5, atol=STEP_ATOL)


if __name__ == "__main__":
    tf.test.main()
