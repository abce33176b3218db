"""Tutorial "Custom training with tf.distribute.Strategy", ported.

Source: tensorflow/docs site/en/tutorials/distribute/custom_training.ipynb
(TF 2.21). Kept as written: the `shuffle(BUFFER_SIZE).batch(GLOBAL_BATCH_SIZE)`
pipelines distributed with `experimental_distribute_dataset`,
`create_model` (its L2 regularizers, no input shape: the model is built at
its first step), the loss with `reduction=NONE`, `compute_average_loss` and
`scale_regularization_loss`, the metrics and optimizer created under the
scope, `train_step`/`test_step` run by `strategy.run` in a `tf.function`
with `strategy.reduce(SUM)`, the `for x in dist_dataset` epochs with a
`tf.train.Checkpoint` saved every other epoch, restoring that checkpoint
into a new model without the strategy and evaluating it with a plain
`tf.function`, the `iter`/`next` loop of 10 steps per epoch, and the
`tf.function` that iterates the whole distributed dataset.

Changed: bundled digits instead of Fashion-MNIST (`harness.load_mnist_like`;
its images have their channel axis already, so `[..., None]` is dropped),
320 training and 256 test examples and 8 per replica instead of 64 (so
that the tutorial's `range(10)` of `next` calls is one whole epoch), 2
epochs instead of 10, the checkpoint under a temporary directory,
`ExampleCounter` as the model's first layer, and results returned instead
of printed. Under Keras 3 the metrics are reset with `reset_state()`: the
tutorial's `reset_states()` is tf-keras's name, which Keras 3 metrics lack
(every contender, one device included, fails on it).

TF's strategy under Keras 3 fails the first step of the tutorial as written
(the model and optimizer are built inside `strategy.run`); this port keeps
that and asserts how it fails.
"""

from __future__ import annotations

import os
import unittest

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

pytestmark = pytest.mark.model
NUM_TRAIN = 320
NUM_TEST = 256
EPOCHS = 2


@harness.keeps_partial_results
def run_tutorial(contender: str, workdir: str, record: harness.Record) -> None:
    (train_images, train_labels), (test_images, test_labels) = harness.load_mnist_like(
        num_train=NUM_TRAIN, num_test=NUM_TEST)
    num_examples = harness.NUM_DIGITS

    # Scale the images to the [0, 1] range.
    train_images = train_images / np.float32(255)
    test_images = test_images / np.float32(255)

    strategy = harness.make_strategy(contender)

    BUFFER_SIZE = len(train_images)

    BATCH_SIZE_PER_REPLICA = 8
    # One device trains on the distributed contenders' global batch.
    GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * harness.NUM_REPLICAS

    train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(BUFFER_SIZE).batch(GLOBAL_BATCH_SIZE)
    test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)

    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
    test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

    def create_model():
        regularizer = tf.keras.regularizers.L2(1e-5)
        model = tf.keras.Sequential([
            harness.ExampleCounter(num_examples, id_scale=1 / 255),
            tf.keras.layers.Conv2D(32, 3,
                                   activation='relu',
                                   kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3,
                                   activation='relu',
                                   kernel_regularizer=regularizer),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64,
                                  activation='relu',
                                  kernel_regularizer=regularizer),
            tf.keras.layers.Dense(10, kernel_regularizer=regularizer)
        ])

        return model

    checkpoint_dir = os.path.join(workdir, 'training_checkpoints')
    checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")

    with strategy.scope():
        # Set reduction to `NONE` so you can do the reduction yourself.
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True,
            reduction=tf.keras.losses.Reduction.NONE)
        def compute_loss(labels, predictions, model_losses):
            per_example_loss = loss_object(labels, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss)
            if model_losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            return loss

    with strategy.scope():
        test_loss = tf.keras.metrics.Mean(name='test_loss')

        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
            name='train_accuracy')
        test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
            name='test_accuracy')

    with strategy.scope():
        model = create_model()

        optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)

        checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)

    counts = harness.PhaseCounts(model.layers[0], strategy)
    record.train_counts = counts.train
    record.inference_counts = counts.inference

    def keep(name, value):
        record.values.setdefault(name, []).append(float(value))

    def reset(metric):
        # Keras 3 metrics have reset_state() only; tf-keras's keep reset_states().
        return metric.reset_state() if harness.KERAS_3 else metric.reset_states()

    def train_step(inputs):
        images, labels = inputs

        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions, model.losses)

        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

        train_accuracy.update_state(labels, predictions)
        return loss

    def test_step(inputs):
        images, labels = inputs

        predictions = model(images, training=False)
        t_loss = loss_object(labels, predictions)

        test_loss.update_state(t_loss)
        test_accuracy.update_state(labels, predictions)

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses,
                               axis=None)

    @tf.function
    def distributed_test_step(dataset_inputs):
        return strategy.run(test_step, args=(dataset_inputs,))

    for epoch in range(EPOCHS):
        # TRAIN LOOP
        total_loss = 0.0
        num_batches = 0
        with counts.counting("train"):
            for x in train_dist_dataset:
                total_loss += distributed_train_step(x)
                num_batches += 1
        train_loss = total_loss / num_batches

        # TEST LOOP
        with counts.counting("inference"):
            for x in test_dist_dataset:
                distributed_test_step(x)

        if epoch % 2 == 0:
            checkpoint.save(checkpoint_prefix)

        keep("train_loss", train_loss)
        keep("train_accuracy", train_accuracy.result())
        keep("test_loss", test_loss.result())
        keep("test_accuracy", test_accuracy.result())

        reset(test_loss)
        reset(train_accuracy)
        reset(test_accuracy)

    record.values["for_loop_weights"] = model.get_weights()

    eval_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
        name='eval_accuracy')

    new_model = create_model()
    new_optimizer = tf.keras.optimizers.Adam()

    test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)

    @tf.function
    def eval_step(images, labels):
        predictions = new_model(images, training=False)
        eval_accuracy(labels, predictions)

    checkpoint = tf.train.Checkpoint(optimizer=new_optimizer, model=new_model)
    checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))

    for images, labels in test_dataset:
        eval_step(images, labels)

    keep("restored_accuracy", eval_accuracy.result())

    for _ in range(EPOCHS):
        total_loss = 0.0
        num_batches = 0
        train_iter = iter(train_dist_dataset)

        with counts.counting("train"):
            for _ in range(10):
                total_loss += distributed_train_step(next(train_iter))
                num_batches += 1
        average_train_loss = total_loss / num_batches

        keep("iter_next_loss", average_train_loss)
        keep("iter_next_accuracy", train_accuracy.result())
        reset(train_accuracy)

    @tf.function
    def distributed_train_epoch(dataset):
        total_loss = 0.0
        num_batches = 0
        for x in dataset:
            per_replica_losses = strategy.run(train_step, args=(x,))
            total_loss += strategy.reduce(
              tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
            num_batches += 1
        return total_loss / tf.cast(num_batches, dtype=tf.float32)

    for epoch in range(EPOCHS):
        with counts.counting("train"):
            train_loss = distributed_train_epoch(train_dist_dataset)

        keep("epoch_function_loss", train_loss)
        keep("epoch_function_accuracy", train_accuracy.result())

        reset(train_accuracy)

    record.weights = model.get_weights()


#: The tutorial's loops, each EPOCHS epochs over the same model: `for x in
#: dist_dataset`, `iter`/`next`, a tf.function over the distributed dataset.
FOR_LOOP, ITER_NEXT, EPOCH_FUNCTION = 0, EPOCHS, 2 * EPOCHS
FOR_LOOP_VALUES = ["train_loss", "train_accuracy", "test_loss", "test_accuracy"]


class CustomTrainingTutorialTest(harness.ConformanceTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.records = cls.run_in_tempdir(run_tutorial)

    def test_tfdist_sees_every_training_example_once_per_epoch_in_for_loop(self):
        self.assert_each_example_once_per_epoch(
            self.records["tfdist"], NUM_TRAIN, EPOCHS, first_epoch=FOR_LOOP)

    def test_tfdist_sees_every_training_example_once_per_epoch_with_iter_next(self):
        self.assert_each_example_once_per_epoch(
            self.records["tfdist"], NUM_TRAIN, EPOCHS, first_epoch=ITER_NEXT)

    def test_tfdist_sees_every_training_example_once_per_epoch_in_tf_function(self):
        self.assert_each_example_once_per_epoch(
            self.records["tfdist"], NUM_TRAIN, EPOCHS, first_epoch=EPOCH_FUNCTION)

    def test_tfdist_evaluates_every_test_example_once_per_epoch(self):
        expected = harness.expected_counts(
            harness.NUM_DIGITS, slice(NUM_TRAIN, NUM_TRAIN + NUM_TEST))
        self.assert_inference_counts(self.records["tfdist"], [expected] * EPOCHS)

    def test_tfdist_matches_one_device_in_for_loop(self):
        self.assert_values_match(
            self.records["tfdist"], self.records["one_device"], FOR_LOOP_VALUES)

    def test_tfdist_checkpoint_restores_without_strategy(self):
        self.assert_values_match(
            self.records["tfdist"], self.records["one_device"], ["restored_accuracy"])

    def test_tfdist_matches_one_device_with_iter_next(self):
        self.assert_values_match(
            self.records["tfdist"], self.records["one_device"],
            ["iter_next_loss", "iter_next_accuracy"])

    def test_tfdist_matches_one_device_in_tf_function(self):
        self.assert_values_match(
            self.records["tfdist"], self.records["one_device"],
            ["epoch_function_loss", "epoch_function_accuracy"])

    def test_tfdist_weights_after_the_for_loop_epochs_match_one_device(self):
        # Not the final weights: every later epoch amplifies the rounding of
        # the gradients' summation order through ReLU and max-pool ties (with
        # SGD, TF's own strategy ends 2e-3 away from one device, as tfdist's
        # ring does); which strategy lands closer is chance. The losses and
        # accuracies of every loop are compared above.
        self.assert_values_match(self.records["tfdist"], self.records["one_device"], ["for_loop_weights"])

    @unittest.skipUnless(harness.KERAS_3, "the failure is Keras 3's")
    @harness.needs_tf_contender
    def test_tf_strategy_fails_with_placeholder_error_under_keras3(self):
        self.assert_failed_with(
            self.records["tf"], "InvalidArgumentError",
            "You must feed a value for placeholder tensor")
        self.assertEmpty(self.records["tf"].values, "it fails at the first step")

    @unittest.skipIf(harness.KERAS_3, "under Keras 3 TF's strategy fails (test above)")
    @harness.needs_tf_contender
    def test_tf_strategy_matches_one_device_under_tf_keras(self):
        # As tfdist's: every value, the weights after the for-loop epochs.
        self.assert_values_match(
            self.records["tf"], self.records["one_device"], sorted(self.records["one_device"].values))


if __name__ == "__main__":
    tfdist.testing.main()
