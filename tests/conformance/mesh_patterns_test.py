"""The conformance patterns that apply to tfdist.MeshStrategy, against one device.

A hybrid 2 x 2 mesh of the 4 logical CPUs: each batch split 2 ways, each
layer split 2 ways by the automatic (Megatron) layouts.

- The "Distributed training with Keras" port (keras_tutorial_test.py) as
  written: a shuffled, cached pipeline whose last batch is short, callbacks
  (TensorBoard, ModelCheckpoint, LearningRateScheduler), `load_weights` of
  the last checkpoint, `evaluate`, and a `.keras` file saved under the
  strategy loaded outside and inside its scope.
- A custom training loop in the style of TF's custom training tutorial:
  `strategy.run` of a step that computes the loss with
  `tf.nn.compute_average_loss` and applies the gradients, over
  `experimental_distribute_dataset`.

One replica as Keras sees it, so one device's global batch is the
strategy's; the results match to float32 rounding. Runs under Keras 3 and,
with TF_USE_LEGACY_KERAS=1, under tf-keras.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness
from tests.conformance import keras_tutorial_test
from tests.conformance import layer_placement_patterns_test

pytestmark = pytest.mark.model
CONTENDER = "tfdist_mesh"


class KerasTutorialUnderMeshTest(keras_tutorial_test.TutorialUnderOneStrategy, harness.ConformanceTestCase):
    CONTENDER = CONTENDER


class CustomTrainingLoopTest(tf.test.TestCase):

    def test_custom_loop_with_strategy_run_matches_one_device(self):
        reference_losses, reference_weights, _ = layer_placement_patterns_test.custom_loop(
            tf.distribute.OneDeviceStrategy(harness.DEVICES[0])
        )
        strategy = harness.make_strategy(CONTENDER)
        losses, weights, _ = layer_placement_patterns_test.custom_loop(strategy)
        self.assertAllClose(losses, reference_losses, rtol=harness.RTOL, atol=harness.ATOL)
        for a, b in zip(weights, reference_weights):
            self.assertAllClose(a, b, rtol=harness.RTOL, atol=harness.ATOL)
        self.assertRegex(strategy.layout_report(), r"dense_?\d*/kernel \| \(\d+, 32\) \| \(None, 'model'\)")


if __name__ == "__main__":
    tfdist.testing.main()
