"""model.fit with a short last step, sharded by tfdist, equals one device.

The dataset size does not divide the global batch. Two ways in:

1. `tfdist.data.shard` in a `dataset_fn` (`ShardedFitTest`): the sharder
   pads the last global step with sample-weight-0 examples. Keras's default
   loss reduction divides by the batch size, padding included; the
   sharder's `normalize_padded_loss` weights of `global_batch_size / M_k`
   make that step train on the mean loss of its M_k real examples.
2. A plain batched dataset given to `fit` (`PlainDatasetFitTest`): the
   strategy shards it itself (`tfdist/data/distributed/`), by default by cutting
   each global batch, or with `shard_steps` given `ShardOptions`. The last
   step's rows split unevenly over the 4 replicas, with no padding rows:
   training, unweighted metrics and `predict` must equal one device
   fitting the same batches.

Input set-up of (1), from what both front ends do with a distributed
dataset: each `dataset_fn` returns `shard(...).repeat()` and `fit` gets
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
# Test-only: TF has no public switch back from enable_op_determinism().
from tensorflow.python.framework import config as tf_config
from absl.testing import parameterized

import tfdist
from tfdist.testing import numerics

pytestmark = [pytest.mark.model, pytest.mark.deferred_tf_keras]
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


_SPLIT_SIZES = (
    # 100 = 3 * 32 + 4: the last step has one row per replica.
    dict(testcase_name="tail_4", num_examples=100),
    # 70 = 2 * 32 + 6: the last step's rows split 2, 2, 1, 1.
    dict(testcase_name="tail_6_uneven", num_examples=70),
    # 98 = 3 * 32 + 2: two replicas get no row in the last step.
    dict(testcase_name="tail_2_empty_replicas", num_examples=98),
)

_INPUTS = (
    dict(testcase_name="split_batches", shard_options=None),
    dict(
        testcase_name="shard_options",
        shard_options=tfdist.data.ShardOptions(shuffle=False),
    ),
)


def _data(num_examples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_examples, 8)).astype("float32")
    y = rng.integers(0, 3, num_examples).astype("int32")
    return x, y


def _build_model():
    return tfdist.testing.small_classifier(keras.optimizers.SGD(learning_rate=0.1))


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
        cls._determinism_was_enabled = tf_config.is_op_determinism_enabled()
        tf.config.experimental.enable_op_determinism()

    @classmethod
    def tearDownClass(cls):
        # Process-wide: leave it as the other test files found it.
        if not cls._determinism_was_enabled:
            tf_config.disable_op_determinism()
        super().tearDownClass()

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


def _batches(*arrays: np.ndarray) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(arrays).batch(GLOBAL_BATCH_SIZE)


class PlainDatasetFitTest(tf.test.TestCase, parameterized.TestCase):
    def _fit_both(self, num_examples, shard_options):
        x, y = _data(num_examples)
        single_device = _build_model()
        initial_weights = single_device.get_weights()
        strategy = tfdist.MirroredStrategy(DEVICES, shard_options=shard_options)
        with strategy.scope():
            distributed = _build_model()
        distributed.set_weights(initial_weights)
        histories = [
            model.fit(_batches(x, y), epochs=EPOCHS, verbose=0).history
            for model in (single_device, distributed)
        ]
        return x, y, single_device, distributed, histories

    @parameterized.named_parameters(
        *[
            dict(
                testcase_name=f"{size['testcase_name']}_{inputs['testcase_name']}",
                num_examples=size["num_examples"],
                shard_options=inputs["shard_options"],
            )
            for size in _SPLIT_SIZES
            for inputs in _INPUTS
        ]
    )
    def test_fit_with_short_last_batch_matches_single_device(
        self, num_examples, shard_options
    ):
        x, y, single_device, distributed, histories = self._fit_both(
            num_examples, shard_options
        )
        numerics.assert_weights_close(
            distributed, single_device, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL
        )
        # Unweighted accuracy counts real rows only (no padding rows).
        self.assertAllClose(
            histories[1]["accuracy"], histories[0]["accuracy"], rtol=1e-6
        )
        evaluated = [
            m.evaluate(_batches(x, y), verbose=0, return_dict=True)
            for m in (single_device, distributed)
        ]
        self.assertAllClose(
            evaluated[1]["accuracy"], evaluated[0]["accuracy"], rtol=1e-6
        )
        predictions = [
            m.predict(_batches(x), verbose=0) for m in (single_device, distributed)
        ]
        self.assertEqual(predictions[1].shape, (num_examples, 3))
        self.assertAllClose(
            predictions[1], predictions[0], rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL
        )

    def test_reported_loss_matches_when_replicas_split_the_tail_evenly(self):
        # 100 = 3 * 32 + 4: every replica gets one row of the last step, so
        # Keras's per-replica loss tracker is exact too (with an uneven
        # split it weights rows by G * b / m; see split_batches).
        x, y, single_device, distributed, histories = self._fit_both(100, None)
        self.assertAllClose(
            histories[1]["loss"], histories[0]["loss"], rtol=1e-5
        )


class ShardOptionsTest(tf.test.TestCase, parameterized.TestCase):
    def test_shard_options_reshuffle_every_epoch_exactly_once(self):
        ids = np.arange(70, dtype=np.int64)
        dataset = tf.data.Dataset.from_tensor_slices((ids, ids)).batch(GLOBAL_BATCH_SIZE)
        strategy = tfdist.MirroredStrategy(
            DEVICES, shard_options=tfdist.data.ShardOptions(seed=3)
        )
        distributed = strategy.experimental_distribute_dataset(dataset)
        epochs = [
            [int(v) for x, _ in distributed
             for local in strategy.experimental_local_results(x) for v in local.numpy()]
            for _ in range(2)
        ]
        for epoch in epochs:
            self.assertEqual(sorted(epoch), ids.tolist())
        self.assertNotEqual(epochs[0], epochs[1])

    @parameterized.named_parameters(
        dict(
            testcase_name="drop",
            kwargs=dict(remainder="drop"),
            error=tfdist.errors.ConfigError,
            text="drop_remainder=True",
        ),
        dict(
            testcase_name="pad",
            kwargs=dict(remainder="pad"),
            error=tfdist.errors.ConfigError,
            text="remainder='split'",
        ),
        dict(
            testcase_name="unknown_remainder",
            kwargs=dict(remainder="trim"),
            error=tfdist.errors.ConfigError,
            text="trim",
        ),
        dict(
            testcase_name="negative_epoch",
            kwargs=dict(epoch=-1),
            error=tfdist.errors.ConfigError,
            text="epoch=-1",
        ),
        dict(
            testcase_name="shuffle_not_bool",
            kwargs=dict(shuffle="yes"),
            error=TypeError,
            text="shuffle='yes'",
        ),
    )
    def test_bad_options_raise_clear_errors(self, kwargs, error, text):
        with self.assertRaisesRegex(error, text):
            tfdist.data.ShardOptions(**kwargs)

    def test_strategy_rejects_options_of_the_wrong_type(self):
        with self.assertRaisesRegex(TypeError, "tfdist.data.ShardOptions"):
            tfdist.MirroredStrategy(DEVICES, shard_options={"shuffle": False})


if __name__ == "__main__":
    tfdist.testing.main()
