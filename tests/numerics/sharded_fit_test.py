"""model.fit on tfdist.data.shard with a padded last step equals one device.

The dataset size does not divide the global batch, so the sharder pads the
last global step with sample-weight-0 examples. Keras's default loss
reduction divides by the batch size, padding included; the sharder's
`normalize_padded_loss` weights of `global_batch_size / M_k` make that step
train on the mean loss of its M_k real examples, as one device fitting with
the same `batch_size` (a short last batch, no padding) does.

Input set-up, from what both front ends do with a distributed dataset:
each `dataset_fn` returns `shard(...).repeat()` and `fit` gets
`steps_per_epoch`, because
- tf-keras refuses any distributed dataset without `steps_per_epoch`;
- with `steps_per_epoch`, both Keras 3 and tf-keras keep one iterator for
  all epochs, so without `.repeat()` epoch 2 finds the input exhausted and
  trains on nothing;
- Keras 3 without `steps_per_epoch` does train the right 4 steps per epoch,
  but with 4 replicas in one input pipeline the sharded dataset's
  cardinality is unknown (TF would count 4 per-replica batches as 4
  steps), so it warns in epoch 1 that the input ran out of data (it learns
  the epoch length that way).
`.repeat()` keeps the epochs apart: each pass over the sharded dataset is
the next sharder epoch. With `shuffle=False` every epoch is in input order,
so any extra iterator Keras starts to peek at a batch changes nothing.

Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1, under tf-keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist.testing import numerics

pytestmark = pytest.mark.model
keras = tf.keras

# Same examples in the same order, same initial weights: the runs differ
# only in how float32 sums are grouped (per replica, then across replicas;
# sum(B / M * loss) / B instead of sum(loss) / M), a few float32 ulps per
# step over 8 SGD steps on O(1) weights.
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-6

GLOBAL_BATCH_SIZE = 32
NUM_REPLICAS = 4
EPOCHS = 2
DEVICES = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]

_SIZES = (
    # 100 = 3 * 32 + 4: the last step's 4 real examples are one per replica.
    dict(testcase_name="tail_4", num_examples=100),
    # 94 = 2 * 32 + 30: per-replica real counts 8, 8, 7, 7, so two replicas'
    # batches are full in the padded step; M_k comes from the plan.
    dict(testcase_name="tail_30", num_examples=94),
)


def _data(num_examples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_examples, 8)).astype("float32")
    y = rng.integers(0, 3, num_examples).astype("int32")
    return x, y


def _build_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


class _StepCounter(keras.callbacks.Callback):
    """Records how many training steps each epoch ran."""

    def __init__(self):
        super().__init__()
        self.steps_per_epoch = []

    def on_epoch_begin(self, epoch, logs=None):
        self.steps_per_epoch.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.steps_per_epoch[-1] += 1


class ShardedFitTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tf.config.experimental.enable_op_determinism()

    def _fit_both(self, num_examples: int, *, normalize_padded_loss: bool):
        """Fits one device and 4 replicas from the same initial weights."""
        x, y = _data(num_examples)
        single_device = _build_model()
        initial_weights = single_device.get_weights()
        single_device.fit(
            x,
            y,
            batch_size=GLOBAL_BATCH_SIZE,
            epochs=EPOCHS,
            shuffle=False,
            verbose=0,
        )

        strategy = tfdist.MirroredStrategy(DEVICES)
        with strategy.scope():
            distributed = _build_model()
        distributed.set_weights(initial_weights)
        examples = tf.data.Dataset.from_tensor_slices((x, y))

        def dataset_fn(input_context):
            # .repeat() and steps_per_epoch: see the module docstring.
            return tfdist.data.shard(
                examples,
                input_context,
                global_batch_size=GLOBAL_BATCH_SIZE,
                shuffle=False,
                remainder="pad",
                normalize_padded_loss=normalize_padded_loss,
            ).repeat()

        steps_per_epoch = -(-num_examples // GLOBAL_BATCH_SIZE)
        counter = _StepCounter()
        distributed.fit(
            strategy.distribute_datasets_from_function(dataset_fn),
            epochs=EPOCHS,
            steps_per_epoch=steps_per_epoch,
            shuffle=False,
            verbose=0,
            callbacks=[counter],
        )
        self.assertEqual(counter.steps_per_epoch, [steps_per_epoch] * EPOCHS)
        return single_device, distributed

    @parameterized.named_parameters(*_SIZES)
    def test_padded_fit_matches_single_device_with_short_last_batch(
        self, num_examples
    ):
        single_device, distributed = self._fit_both(
            num_examples, normalize_padded_loss=True
        )
        numerics.assert_weights_close(
            distributed, single_device, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL
        )

    def test_unnormalized_padding_diverges_from_single_device(self):
        # 0/1 weights: the padded step's gradient is 4 / 32 of the
        # single-device one, far outside the float32 tolerance.
        single_device, distributed = self._fit_both(
            100, normalize_padded_loss=False
        )
        with self.assertRaisesRegex(AssertionError, "differ beyond"):
            numerics.assert_weights_close(
                distributed, single_device, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL
            )
        _, difference = numerics.max_weight_difference(
            distributed, single_device
        )
        self.assertGreater(difference, 100 * FLOAT32_ATOL)


if __name__ == "__main__":
    tfdist.testing.main()
