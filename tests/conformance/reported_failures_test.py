"""The ways tfdist once broke scripts that run on TF's MirroredStrategy, each as a test.

Each failure was reported from a user's script, not from tfdist's own
helpers, and each test here fails on the code before the fix:

1. a shuffled pipeline (`shuffle` without a seed, a generator yielding in
   random order) lost and repeated examples: every replica ran its own copy
   and kept its slice of each batch;
2. custom loops broke: `for x, y in strategy.experimental_distribute_dataset(ds)`
   raised "too many values to unpack" (an extra weights component);
3. small and uneven evaluation data: `predict(x[:5])` and a validation set
   smaller than one batch raised, `evaluate` on 42 rows at batch 32 gave a
   loss 1.3 % off one device's;
4. TF's constructor arguments raised `TypeError` (`cross_device_ops=` here;
   `cluster_resolver=` and `communication_options=` are how every
   multi-worker conformance run builds tfdist's strategy,
   `harness.make_strategy`);
5. (multi-worker) a worker stalled before building its model left the others
   waiting in TF's initial broadcast without a bound:
   `tests/integration/fault_test.py::StuckWorkerTest`, and the unseeded
   shuffle across workers: `multi_worker_user_patterns_test.py`.

Every check compares with one device (`OneDeviceStrategy`) on the same
batches.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

pytestmark = pytest.mark.model
keras = tf.keras

NUM_EXAMPLES = 200
BATCH_SIZE = 32  # Global; 200 = 6 * 32 + 8: a short last batch.


def _data() -> tuple[np.ndarray, np.ndarray]:
    (x, y), _ = harness.load_mnist_like(num_train=NUM_EXAMPLES)
    return x / 255.0, y  # The id channel becomes id / 255.


def _model(strategy: tf.distribute.Strategy) -> tuple[keras.Model, harness.ExampleCounter]:
    keras.utils.set_random_seed(harness.SEED)
    with strategy.scope():
        counter = harness.ExampleCounter(NUM_EXAMPLES, id_scale=1 / 255)
        model = harness.counting_classifier(counter, learning_rate=0.05)
    return model, counter


def _one_device() -> tf.distribute.Strategy:
    return harness.make_strategy("one_device")


class ShuffledInputTest(harness.ConformanceTestCase):
    """1: every example exactly once per epoch, whatever the pipeline's randomness."""

    def _fit_counts(self, dataset: tf.data.Dataset, epochs: int = 2) -> list[np.ndarray]:
        strategy = tfdist.MirroredStrategy(harness.DEVICES)
        model, counter = _model(strategy)
        epoch_counts = harness.EpochCounts(counter, strategy)
        model.fit(dataset, epochs=epochs, callbacks=[epoch_counts], verbose=0)
        return epoch_counts.per_epoch

    def test_unseeded_shuffle_in_fit(self):
        x, y = _data()
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(NUM_EXAMPLES).batch(BATCH_SIZE)
        for counts in self._fit_counts(dataset):
            self.assertAllEqual(counts, np.ones(NUM_EXAMPLES))

    def test_generator_yielding_in_random_order_in_fit(self):
        x, y = _data()

        def examples():
            order = list(range(NUM_EXAMPLES))
            random.shuffle(order)
            for i in order:
                yield x[i], y[i]

        dataset = tf.data.Dataset.from_generator(
            examples, output_signature=(tf.TensorSpec((28, 28, 2), tf.float64),
                                        tf.TensorSpec((), tf.uint8))).batch(BATCH_SIZE)
        for counts in self._fit_counts(dataset):
            self.assertAllEqual(counts, np.ones(NUM_EXAMPLES))

    def test_unseeded_shuffle_in_evaluate(self):
        x, y = _data()
        strategy = tfdist.MirroredStrategy(harness.DEVICES)
        model, counter = _model(strategy)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(NUM_EXAMPLES).batch(BATCH_SIZE)
        _, counts = harness.counts_during(
            counter, strategy, "inference", lambda: model.evaluate(dataset, verbose=0))
        self.assertAllEqual(counts, np.ones(NUM_EXAMPLES))


class CustomLoopTest(harness.ConformanceTestCase):
    """2: distributed datasets keep the user's element structure."""

    def _dataset(self) -> tf.data.Dataset:
        x, y = _data()
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(NUM_EXAMPLES).batch(BATCH_SIZE)

    def test_elements_unpack_as_the_users_pairs_and_cover_every_example(self):
        strategy = tfdist.MirroredStrategy(harness.DEVICES)
        seen = []
        for x, y in strategy.experimental_distribute_dataset(self._dataset()):
            for images, labels in zip(strategy.experimental_local_results(x),
                                      strategy.experimental_local_results(y)):
                self.assertEqual(images.shape[0], labels.shape[0])
                seen.extend(np.round(images.numpy()[:, 0, 0, -1] * 255).astype(int).tolist())
        self.assertEqual(sorted(seen), list(range(NUM_EXAMPLES)))

    def test_element_spec_has_the_structure_of_tfs(self):
        ours = tfdist.MirroredStrategy(harness.DEVICES).experimental_distribute_dataset(self._dataset())
        theirs = tf.distribute.MirroredStrategy(harness.DEVICES).experimental_distribute_dataset(
            self._dataset())
        tf.nest.assert_same_structure(ours.element_spec, theirs.element_spec, expand_composites=False)
        self.assertLen(tf.nest.flatten(ours.element_spec), 2)

    def test_distributed_function_traced_from_element_spec_returns_the_loss_alone(self):
        strategy = tfdist.MirroredStrategy(harness.DEVICES)
        distributed = strategy.experimental_distribute_dataset(self._dataset())

        @tf.function(input_signature=[distributed.element_spec])
        def step(batch):
            x, y = batch
            per_replica = strategy.run(lambda a, b: tf.reduce_sum(tf.cast(b, tf.float32)), args=(x, y))
            return strategy.reduce("SUM", per_replica, axis=None)

        total = sum(float(step(batch)) for batch in distributed)
        self.assertEqual(total, float(np.sum(_data()[1])))


class SmallEvaluationDataTest(harness.ConformanceTestCase):
    """3: any number of rows in evaluate/predict/validation, as one device."""

    def test_predict_on_fewer_rows_than_replicas_matches_one_device(self):
        x, _ = _data()
        reference = _model(_one_device())[0].predict(x[:5], batch_size=BATCH_SIZE, verbose=0)
        predictions = _model(tfdist.MirroredStrategy(harness.DEVICES))[0].predict(
            x[:5], batch_size=BATCH_SIZE, verbose=0)
        self.assertEqual(predictions.shape, (5, 10))
        self.assertAllClose(predictions, reference, rtol=1e-5, atol=1e-6)

    def test_evaluate_on_an_uneven_last_batch_matches_one_device_loss_included(self):
        x, y = _data()
        reference = _model(_one_device())[0].evaluate(x[:42], y[:42], batch_size=BATCH_SIZE, verbose=0)
        result = _model(tfdist.MirroredStrategy(harness.DEVICES))[0].evaluate(
            x[:42], y[:42], batch_size=BATCH_SIZE, verbose=0)
        self.assertAllClose(result, reference, rtol=1e-6, atol=1e-6)

    def test_validation_smaller_than_one_batch_matches_one_device(self):
        x, y = _data()

        def fit(strategy):
            history = _model(strategy)[0].fit(
                x[:160], y[:160], batch_size=BATCH_SIZE, epochs=2, shuffle=False,
                validation_data=(x[160:163], y[160:163]), verbose=0)
            return history.history

        reference = fit(_one_device())
        history = fit(tfdist.MirroredStrategy(harness.DEVICES))
        for key in ("loss", "val_loss", "val_accuracy"):
            self.assertAllClose(history[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)

    def test_a_batch_size_the_replicas_do_not_divide_trains_as_one_device(self):
        # TF's distributed-training guide fits batch(10) on its replicas.
        x, y = _data()

        def fit(strategy):
            model = _model(strategy)[0]
            model.fit(x[:180], y[:180], batch_size=30, epochs=1, shuffle=False, verbose=0)
            history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(30),
                                epochs=1, verbose=0)  # 200 rows: a short tail.
            return model.get_weights(), history.history["loss"]

        weights, loss = fit(tfdist.MirroredStrategy(harness.DEVICES))
        reference_weights, reference_loss = fit(_one_device())
        self.assertAllClose(loss, reference_loss, rtol=1e-5, atol=1e-6)
        for got, want in zip(weights, reference_weights):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)

    def test_an_overridden_train_step_on_such_a_batch_names_the_users_batch_size(self):
        x, y = _data()
        with tfdist.MirroredStrategy(harness.DEVICES).scope():
            model = OwnTrainStepModel([
                keras.Input((28, 28, 2)), keras.layers.Flatten(), keras.layers.Dense(10)])
            model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        with self.assertRaisesRegex(tfdist.errors.ConfigError,
                                    r"batch_size=30\b.*overrides train_step.*28 or 32"):
            model.fit(x[:180], y[:180], batch_size=30, epochs=1, verbose=0)


class OwnTrainStepModel(keras.Sequential):
    """A model whose `train_step` is the user's (here, Keras's body called)."""

    def train_step(self, data):
        return super().train_step(data)


class ConstructorTest(harness.ConformanceTestCase):
    """4: TF's constructor arguments, with TF's meaning."""

    def test_tf_cross_device_ops_keyword_trains_as_one_device(self):
        x, y = _data()

        def fit(strategy):
            model = _model(strategy)[0]
            model.fit(x[:192], y[:192], batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0)
            return model.get_weights()

        reference = fit(_one_device())
        weights = fit(tfdist.MirroredStrategy(
            devices=harness.DEVICES, cross_device_ops=tf.distribute.ReductionToOneDevice()))
        for got, want in zip(weights, reference):
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    tfdist.testing.main()
