"""Guide "Mixed precision", ported with a strategy (one device, TF's strategy, tfdist).

Source: tensorflow/docs site/en/guide/mixed_precision.ipynb (TF 2.21). The
guide uses no strategy; this port builds the model under each contender's
scope, as the distributed-training guides say, and distributes the custom
loop as "Custom training with tf.distribute.Strategy" does.

Kept as written: the global `mixed_float16` policy, the functional model
(two `Dense(64)`, the CPU branch's width, a float32 softmax `Activation`
and the float32 `linear` one after it), `compile` with RMSprop and
`sparse_categorical_crossentropy`, `fit` on NumPy arrays with
`batch_size=8192`, 5 epochs and `validation_split=0.2`, `evaluate`, then
`set_weights(initial_weights)` and the custom loop with a
`LossScaleOptimizer` around a new RMSprop, over a `shuffle(10000)` dataset
batched by 8192, with a `Mean` of the loss and a test accuracy per epoch.

Changed: bundled digits (`harness.load_mnist_like`, 320 training and 128
test examples, flat with the id as a 785th feature read by an
`ExampleCounter` kept in float32 so that ids survive the policy); the
strategy scope around the model, its compilation and the second optimizer;
the custom loop's replica step run by `strategy.run` in a `tf.function`
with the losses summed by `strategy.reduce`, on the distributed dataset,
and its loss taken with `reduction=NONE` and `tf.nn.compute_average_loss`
(the guide's default reduction averages per replica, which over N
replicas would give N times one device's gradient); under Keras 3 the loss
is scaled with `optimizer.scale_loss` and `apply_gradients` unscales (the
guide's `get_scaled_loss`/`get_unscaled_gradients` are tf-keras's and
fail under Keras 3 on every contender); the dtype prints are left out;
results are returned, and the global policy is restored afterwards. The
custom loop's test step calls the model outside `strategy.run`, as the
guide does, so those examples are not counted. Each loop also records the
weights at the end of every epoch (and the initial ones), so that every
logged value can be checked against the weights that produced it.

How the float16 runs are compared, on any CPU: tfdist against TF's strategy
(the same per-replica float16 arithmetic on the same machine) to float32
rounding; each logged loss and accuracy against a float64 replay of the
weights that produced it, within this machine's measured float16 rounding
(`Float16Replay`: an example whose prediction that rounding could flip may
count either way, so accuracies are bounded in examples, not by a tolerance
tuned on one CPU); and the weights against one device's within float16
training's drift.
"""

from __future__ import annotations

import unittest

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

#: TF's strategy traces this guide's steps in 4 replica threads that hand
#: control to each other, and its `fit` takes ~15-20 s here alone (each
#: epoch's validation 1-3 s, against 0.1-0.3 s under tfdist and one
#: device); on a 2-core CI machine shared with multi-process tests the
#: class's set-up once took over pytest's 300 s (the stack dump showed TF's
#: replica threads still tracing a test step, not hung).
SETUP_TIMEOUT_S = 900
pytestmark = [pytest.mark.model, pytest.mark.timeout(SETUP_TIMEOUT_S)]
keras = tf.keras
layers = tf.keras.layers
mixed_precision = tf.keras.mixed_precision
NUM_TRAIN = 320
NUM_TEST = 128
EPOCHS = 5
#: `validation_split=0.2` keeps the last 20% of the training arrays.
NUM_FIT = 256

#: How far float16 training drifts from one device. Each replica rounds its
#: partial gradient sums to float16 where one device rounds the whole
#: batch's once, and RMSprop then moves every weight by up to ~lr whatever
#: its gradient's size: where rounding changes a gradient near zero, a
#: weight can step differently each step, and the difference feeds the next
#: steps. No useful worst case exists (RMSprop's steps bound it only by
#: 2 * steps * lr / sqrt(1 - rho) = 3.2e-2), so this drift is bounded as
#: measured: at most 2.1e-3 over the 5 steps of either loop (4 replicas,
#: oneDNN on and off: identical; CPUs with native float16 pass it too), with
#: a margin. The strict checks are the others: tfdist against TF's strategy
#: (the same per-replica arithmetic) to float32 rounding, and every logged
#: value against the weights that produced it.
DRIFT_RTOL = 1e-2
DRIFT_ATOL = 3e-3
#: A logged loss or accuracy is a float32 mean (and a float32 log): a few
#: float32 roundings of its size.
FLOAT32_SLACK = 1e-6
FIT_VALUES = ["loss", "accuracy", "val_loss", "val_accuracy", "test_scores"]


class EpochWeights(keras.callbacks.Callback):
    """The model's weights at the end of each epoch (after its validation)."""

    def __init__(self):
        super().__init__()
        self.per_epoch = []

    def on_epoch_end(self, epoch, logs=None):
        self.per_epoch.append(self.model.get_weights())


@harness.keeps_partial_results
def run_guide(contender, workdir, record):
    try:
        run_cells(contender, record)
    finally:
        mixed_precision.set_global_policy('float32')


def run_cells(contender, record):
    (train_images, y_train), (test_images, y_test) = harness.load_mnist_like(
        num_train=NUM_TRAIN, num_test=NUM_TEST)
    strategy = harness.make_strategy(contender)

    policy = mixed_precision.Policy('mixed_float16')
    mixed_precision.set_global_policy(policy)

    with strategy.scope():
        inputs = keras.Input(shape=(785,), name='digits')
        counter = harness.ExampleCounter(harness.NUM_DIGITS, id_scale=1 / 255, dtype='float32')
        x = counter(inputs)
        num_units = 64
        dense1 = layers.Dense(num_units, activation='relu', name='dense_1')
        x = dense1(x)
        dense2 = layers.Dense(num_units, activation='relu', name='dense_2')
        x = dense2(x)

        # CORRECT: softmax and model output are float32
        x = layers.Dense(10, name='dense_logits')(x)
        outputs = layers.Activation('softmax', dtype='float32', name='predictions')(x)

        # The linear activation is an identity function. So this simply casts 'outputs'
        # to float32. In this particular case, 'outputs' is already float32 so this is a
        # no-op.
        outputs = layers.Activation('linear', dtype='float32')(outputs)

        model = keras.Model(inputs=inputs, outputs=outputs)
        model.compile(loss='sparse_categorical_crossentropy',
                      optimizer=keras.optimizers.RMSprop(),
                      metrics=['accuracy'])

    x_train = harness.flat_images(train_images) / 255
    x_test = harness.flat_images(test_images) / 255

    initial_weights = model.get_weights()
    record.values["initial_weights"] = initial_weights

    epoch_counts = harness.EpochCounts(counter, strategy)
    record.train_counts = epoch_counts.per_epoch
    epoch_weights = EpochWeights()
    record.values["fit_epoch_weights"] = epoch_weights.per_epoch
    history, validation_counts = harness.counts_during(
        counter, strategy, "inference",
        lambda: model.fit(x_train, y_train,
                          batch_size=8192,
                          epochs=5,
                          validation_split=0.2,
                          callbacks=[epoch_counts, epoch_weights], verbose=0))
    record.inference_counts.append(validation_counts)
    record.values.update(history.history)
    test_scores, test_counts = harness.counts_during(
        counter, strategy, "inference", lambda: model.evaluate(x_test, y_test, verbose=0))
    record.inference_counts.append(test_counts)
    record.values["test_scores"] = test_scores

    with strategy.scope():
        optimizer = keras.optimizers.RMSprop()
        optimizer = mixed_precision.LossScaleOptimizer(optimizer)

        # NONE and compute_average_loss: the loss is averaged over the global batch.
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            reduction=tf.keras.losses.Reduction.NONE)
    train_dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                     .shuffle(10000).batch(8192))
    test_dataset = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(8192)
    dist_train_dataset = strategy.experimental_distribute_dataset(train_dataset)

    def train_step(x, y):
        with tf.GradientTape() as tape:
            predictions = model(x)
            loss = tf.nn.compute_average_loss(loss_object(y, predictions))
            if harness.KERAS_3:
                scaled_loss = optimizer.scale_loss(loss)
            else:
                scaled_loss = optimizer.get_scaled_loss(loss)
        scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
        if harness.KERAS_3:
            gradients = scaled_gradients  # Keras 3's apply_gradients unscales.
        else:
            gradients = optimizer.get_unscaled_gradients(scaled_gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(x, y):
        per_replica_losses = strategy.run(train_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    @tf.function
    def test_step(x):
        return model(x, training=False)

    model.set_weights(initial_weights)

    # The guide's step calls `model(x)` without `training=True`, so the
    # counter files its examples under inference; they go after fit's epochs.
    counts = harness.PhaseCounts(counter, strategy)
    counts.inference = record.train_counts
    for epoch in range(5):
        epoch_loss_avg = tf.keras.metrics.Mean()
        test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
            name='test_accuracy')
        with counts.counting("inference"):
            for x, y in dist_train_dataset:
                loss = distributed_train_step(x, y)
                epoch_loss_avg(loss)
        for x, y in test_dataset:
            predictions = test_step(x)
            test_accuracy.update_state(y, predictions)
        record.values.setdefault("custom_loop_loss", []).append(float(epoch_loss_avg.result()))
        record.values.setdefault("custom_loop_test_accuracy", []).append(float(test_accuracy.result()))
        record.values.setdefault("custom_loop_epoch_weights", []).append(model.get_weights())
    record.weights = model.get_weights()


class Float16Replay:
    """The guide's model recomputed in float64 from weights a run recorded.

    Checks each logged value against the weights that produced it, within the
    rounding error of this machine's float16 kernels, so the check holds on
    any CPU: one whose oneDNN computes float16 natively (AVX512_FP16, AMX)
    rounds the sums of a float16 matmul other than one that does not. The
    error is measured here, for each set of weights and examples: the guide's
    layers under the `mixed_float16` policy against float64.
    """

    #: The error measured (one run of the float16 model, its own grouping of
    #: sums) stands for every float16 kernel of this CPU; a kernel that
    #: groups a sum otherwise (another batch size, a replica's share) is as
    #: far from the exact value, perhaps on the other side: twice covers it.
    ERROR_MARGIN = 2.0
    #: Keras's cross-entropy clips probabilities to [eps, 1 - eps].
    EPSILON = 1e-7

    def __init__(self):
        (train_images, y_train), (test_images, y_test) = harness.load_mnist_like(
            num_train=NUM_TRAIN, num_test=NUM_TEST)
        # The features the first Dense gets: the counter strips the id.
        x_train = (harness.flat_images(train_images) / 255)[:, :-1]
        x_test = (harness.flat_images(test_images) / 255)[:, :-1]
        self.examples = {
            "fit": (x_train[:NUM_FIT], y_train[:NUM_FIT]),
            "validation": (x_train[NUM_FIT:], y_train[NUM_FIT:]),
            "train": (x_train, y_train),
            "test": (x_test, y_test),
        }
        policy = mixed_precision.Policy('mixed_float16')
        inputs = keras.Input(shape=(784,))
        x = layers.Dense(64, activation='relu', dtype=policy)(inputs)
        x = layers.Dense(64, activation='relu', dtype=policy)(x)
        x = layers.Dense(10, dtype=policy)(x)
        self._float16_model = keras.Model(inputs, layers.Activation('linear', dtype='float32')(x))
        # By (id of the recorded weights, split): the records hold the weights.
        self._bounds = {}

    @staticmethod
    def logits(weights, x):
        h = np.asarray(x, np.float64)
        for i in range(0, len(weights), 2):
            h = h @ np.asarray(weights[i], np.float64) + weights[i + 1]
            if i + 2 < len(weights):
                h = np.maximum(h, 0.0)
        return h

    def bounds(self, weights, split):
        """Bounds on the accuracy and loss that float16 kernels can log.

        Returns:
          ((low, high) accuracy, (low, high) mean cross-entropy) of the
          model with `weights` on the examples `split`.
        """
        key = (id(weights), split)
        if key not in self._bounds:
            self._bounds[key] = self._compute_bounds(weights, split)
        return self._bounds[key]

    def _compute_bounds(self, weights, split):
        x, y = self.examples[split]
        exact = self.logits(weights, x)
        self._float16_model.set_weights(weights)
        # Called eagerly, not through `predict`: the same float16 kernels,
        # without a traced function per batch shape and a loop per call.
        float16 = self._float16_model(np.asarray(x, np.float32), training=False).numpy()
        error = self.ERROR_MARGIN * np.max(np.abs(float16 - exact))
        rows = np.arange(len(y))
        others = exact.copy()
        others[rows, y] = -np.inf
        margin = exact[rows, y] - others.max(axis=1)
        # A logit is off by at most `error`, so a difference of two by twice that.
        surely_right = np.count_nonzero(margin > 2 * error)
        surely_wrong = np.count_nonzero(margin < -2 * error)
        # d(cross-entropy)/d(logits) = softmax - onehot: its L1 norm is at most 2.
        loss = np.mean(self.cross_entropy(exact, y))
        return (
            (surely_right / len(y), 1 - surely_wrong / len(y)),
            (loss - 2 * error, loss + 2 * error),
        )

    @classmethod
    def cross_entropy(cls, logits, y):
        shifted = logits - logits.max(axis=1, keepdims=True)
        probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
        return -np.log(np.clip(probabilities[np.arange(len(y)), y], cls.EPSILON, 1 - cls.EPSILON))


class MixedPrecisionGuideTest(harness.ConformanceTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.records = cls.run_in_tempdir(run_guide)
        cls.replay = Float16Replay()

    def assert_logged(self, value, weights, split, kind):
        """`value` is what `weights` give on `split` in float16 arithmetic."""
        accuracy, loss = self.replay.bounds(weights, split)
        low, high = accuracy if kind == "accuracy" else loss
        # The logged value went through float32 (a mean, a log).
        slack = FLOAT32_SLACK * max(1.0, abs(value))
        self.assertBetween(value, low - slack, high + slack)

    def assert_fit_logs_its_weights(self, record):
        """Each of fit's logged values is what the weights of its time give.

        The run may have failed after `fit` and `evaluate` (TF's custom loop).
        """
        values = record.values
        self.assertIn("test_scores", values, f"the run stopped before: {record.error}")
        before = [values["initial_weights"]] + values["fit_epoch_weights"][:-1]
        for epoch in range(EPOCHS):
            after = values["fit_epoch_weights"][epoch]
            for name, weights, split in (
                ("loss", before[epoch], "fit"), ("accuracy", before[epoch], "fit"),
                ("val_loss", after, "validation"), ("val_accuracy", after, "validation"),
            ):
                with self.subTest(value=name, epoch=epoch):
                    kind = "accuracy" if name.endswith("accuracy") else "loss"
                    self.assert_logged(values[name][epoch], weights, split, kind)
        test_loss, test_accuracy = values["test_scores"]
        with self.subTest(value="test_scores"):
            self.assert_logged(test_loss, values["fit_epoch_weights"][-1], "test", "loss")
            self.assert_logged(test_accuracy, values["fit_epoch_weights"][-1], "test", "accuracy")

    def assert_custom_loop_logs_its_weights(self, record):
        self.assert_ran(record)
        values = record.values
        after = values["custom_loop_epoch_weights"]
        before = [values["initial_weights"]] + after[:-1]
        for epoch in range(EPOCHS):
            with self.subTest(value="custom_loop_loss", epoch=epoch):
                # The step's loss: the whole training set in one batch, before its update.
                self.assert_logged(values["custom_loop_loss"][epoch], before[epoch], "train", "loss")
            with self.subTest(value="custom_loop_test_accuracy", epoch=epoch):
                self.assert_logged(
                    values["custom_loop_test_accuracy"][epoch], after[epoch], "test", "accuracy")

    def assert_weights_drift_within_float16(self, record, reference, name):
        """Per epoch, `record`'s weights `name` within float16 drift of `reference`'s."""
        self.assertLen(record.values.get(name, []), EPOCHS, f"the run stopped before: {record.error}")
        for epoch, (got, want) in enumerate(zip(record.values[name], reference.values[name])):
            with self.subTest(weights=name, epoch=epoch):
                for a, b in zip(got, want):
                    self.assertAllClose(a, b, rtol=DRIFT_RTOL, atol=DRIFT_ATOL)

    def assert_fit_matches_one_device(self, contender):
        record, one_device = self.records[contender], self.records["one_device"]
        self.assert_fit_logs_its_weights(one_device)
        self.assert_fit_logs_its_weights(record)
        self.assert_weights_drift_within_float16(record, one_device, "fit_epoch_weights")

    def assert_custom_loop_matches_one_device(self, contender):
        record, one_device = self.records[contender], self.records["one_device"]
        self.assert_custom_loop_logs_its_weights(one_device)
        self.assert_custom_loop_logs_its_weights(record)
        # The loop starts again from fit's initial weights, drawn from one seed.
        for a, b in zip(record.values["initial_weights"], one_device.values["initial_weights"]):
            self.assertAllEqual(a, b)
        self.assert_weights_drift_within_float16(record, one_device, "custom_loop_epoch_weights")

    def test_tfdist_fit_sees_every_training_example_once_per_epoch(self):
        self.assert_each_example_once_per_epoch(
            self.records["tfdist"], NUM_FIT, EPOCHS, first_epoch=0)

    def test_tfdist_validates_and_evaluates_every_example_once_per_call(self):
        validation = harness.expected_counts(
            harness.NUM_DIGITS, slice(NUM_FIT, NUM_TRAIN), times=EPOCHS)
        test = harness.expected_counts(harness.NUM_DIGITS, slice(NUM_TRAIN, NUM_TRAIN + NUM_TEST))
        self.assert_inference_counts(self.records["tfdist"], [validation, test])

    @harness.needs_tf_contender
    def test_tfdist_fit_matches_tf_strategy(self):
        # The same per-replica float16 arithmetic on the same CPU: only the
        # order of the float32 all-reduce's sums differs.
        record, tf_record = self.records["tfdist"], self.records["tf"]
        self.assert_values_match(record, tf_record, FIT_VALUES + ["fit_epoch_weights"])

    def test_tfdist_fit_matches_one_device(self):
        self.assert_fit_matches_one_device("tfdist")

    def test_tfdist_custom_loop_sees_every_training_example_once_per_epoch(self):
        # The custom loop trains on all NUM_TRAIN examples.
        self.assert_each_example_once_per_epoch(
            self.records["tfdist"], NUM_TRAIN, EPOCHS, first_epoch=EPOCHS)

    def test_tfdist_custom_loop_matches_one_device(self):
        self.assert_custom_loop_matches_one_device("tfdist")

    @harness.needs_tf_contender
    def test_tf_strategy_fit_matches_one_device(self):
        self.assert_fit_matches_one_device("tf")

    @unittest.skipUnless(harness.KERAS_3, "the failure is Keras 3's")
    @harness.needs_tf_contender
    def test_tf_strategy_custom_loop_fails_with_placeholder_error_under_keras3(self):
        self.assert_failed_with(
            self.records["tf"], "InvalidArgumentError",
            "You must feed a value for placeholder tensor")
        self.assertNotIn("custom_loop_loss", self.records["tf"].values, "it fails at the first step")

    @unittest.skipIf(harness.KERAS_3, "under Keras 3 TF's strategy fails (test above)")
    @harness.needs_tf_contender
    def test_tf_strategy_custom_loop_matches_one_device_under_tf_keras(self):
        self.assert_custom_loop_matches_one_device("tf")

    @unittest.skipIf(harness.KERAS_3, "under Keras 3 TF's strategy fails its custom loop")
    @harness.needs_tf_contender
    def test_tfdist_custom_loop_matches_tf_strategy_under_tf_keras(self):
        self.assert_same_results(self.records["tfdist"], self.records["tf"])


if __name__ == "__main__":
    tfdist.testing.main()
