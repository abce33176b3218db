"""The conformance patterns that apply to tfdist.LayerPlacementStrategy, against one device.

- The "Distributed training with Keras" port (keras_tutorial_test.py) as
  written: a shuffled, cached pipeline whose last batch is short, callbacks
  (TensorBoard, ModelCheckpoint, LearningRateScheduler), `load_weights` of
  the last checkpoint, `evaluate`, and a `.keras` file saved under the
  strategy loaded outside and inside its scope; the model's layers over the
  4 logical CPUs in 4 microbatches a step.
- A custom training loop in the style of TF's custom training tutorial:
  `strategy.place(model)`, then `strategy.run` of a step that computes the
  loss with `tf.nn.compute_average_loss` and applies the gradients, over
  `experimental_distribute_dataset` (a user's step runs on the whole batch:
  only Keras's own steps are split into microbatches).

One replica, so one device's global batch is the strategy's; the results
match to float32 rounding (microbatch gradients are summed). Runs under
Keras 3 and, with TF_USE_LEGACY_KERAS=1, under tf-keras.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tfdist
from tfdist._internal import keras_layers
from tests.conformance import harness
from tests.conformance import keras_tutorial_test

pytestmark = pytest.mark.model
keras = tf.keras
CONTENDER = "tfdist_layer_placement"


class KerasTutorialUnderLayerPlacementTest(keras_tutorial_test.TutorialUnderOneStrategy, harness.ConformanceTestCase):
    CONTENDER = CONTENDER


def custom_loop(strategy, *, epochs=2, global_batch_size=48):
    """TF's custom-loop pattern; returns (per-epoch mean losses, weights)."""
    keras.utils.set_random_seed(harness.SEED)  # The shuffle's and the weights'.
    (x, y), _ = harness.load_mnist_like(num_train=240)
    x = x[..., :1].astype("float32") / 255.0  # The image channel only.
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(240, seed=harness.SEED)
        .batch(global_batch_size)  # 240 = 5 x 48.
    )
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ])
        optimizer = keras.optimizers.Adam(1e-3)
        loss_object = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        )
    if isinstance(strategy, tfdist.LayerPlacementStrategy):
        strategy.place(model)  # tfdist: before the first strategy.run.
    distributed = strategy.experimental_distribute_dataset(dataset)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = tf.nn.compute_average_loss(
                loss_object(labels, predictions), global_batch_size=global_batch_size
            )
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(inputs):
        losses = strategy.run(train_step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    epoch_losses = []
    for _ in range(epochs):
        total, batches = 0.0, 0
        for inputs in distributed:
            total += float(distributed_train_step(inputs))
            batches += 1
        epoch_losses.append(total / batches)
    return epoch_losses, [v.numpy() for v in model.trainable_variables], model


class CustomTrainingLoopTest(tf.test.TestCase):

    def test_custom_loop_with_strategy_run_matches_one_device(self):
        reference_losses, reference_weights, _ = custom_loop(
            tf.distribute.OneDeviceStrategy(harness.DEVICES[0])
        )
        strategy = tfdist.LayerPlacementStrategy(harness.DEVICES, num_microbatches=4)
        losses, weights, model = custom_loop(strategy)
        self.assertAllClose(losses, reference_losses, rtol=harness.RTOL, atol=harness.ATOL)
        for a, b in zip(weights, reference_weights):
            self.assertAllClose(a, b, rtol=harness.RTOL, atol=harness.ATOL)
        # The layers really were spread over the devices (pooling and
        # flattening stages hold no variables).
        self.assertEqual(strategy.placement_plan().num_stages, 4)
        self.assertGreater(len({v.device for v in keras_layers.resource_variables(model)}), 1)


if __name__ == "__main__":
    tfdist.testing.main()
