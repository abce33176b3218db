"""Tutorial "Distributed training with Keras", ported (one device, TF's strategy, tfdist).

Source: tensorflow/docs site/en/tutorials/distribute/keras.ipynb (TF 2.21).
Kept as written: the `scale`/`cache`/`shuffle(BUFFER_SIZE)`/`batch` pipeline,
64 examples per replica, the model and its compile arguments, the four
callbacks (TensorBoard, ModelCheckpoint of `.weights.h5`, the
LearningRateScheduler with `decay`, PrintLR), `load_weights` of the last
checkpoint, `evaluate`, and saving as `.keras` and loading it outside and
inside the strategy's scope. Under tf-keras the checkpoints are TF-format
(`ckpt_{epoch}`, restored from `tf.train.latest_checkpoint`), as the
tutorial wrote them for tf-keras (tensorflow/docs dfea1366e): tf-keras's
`load_weights` of a `.weights.h5` fails under any strategy, TF's
`OneDeviceStrategy` included (it assigns an h5py dataset to the compiled
metrics' sync-on-read variables). Changed: bundled digits instead of tfds MNIST
(`harness.load_mnist_like`), 3 epochs instead of 12, files under a temporary
directory, `ExampleCounter` before the first layer (which therefore gets
its input from an `Input` rather than `input_shape=`), and the results
returned instead of printed.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

pytestmark = pytest.mark.model
keras = tf.keras
EPOCHS = 3


def run_tutorial(contender: str, workdir: str) -> harness.Record:
    (train_x, train_y), (test_x, test_y) = harness.load_mnist_like(num_train=768)
    mnist_train = tf.data.Dataset.from_tensor_slices((train_x, train_y))
    mnist_test = tf.data.Dataset.from_tensor_slices((test_x, test_y))
    num_examples = len(train_x) + len(test_x)

    strategy = harness.make_strategy(contender)

    BUFFER_SIZE = 10000
    BATCH_SIZE_PER_REPLICA = 64
    # One device trains on the distributed contenders' global batch.
    BATCH_SIZE = BATCH_SIZE_PER_REPLICA * harness.NUM_REPLICAS

    def scale(image, label):
        image = tf.cast(image, tf.float32)
        image /= 255
        return image, label

    train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE).batch(BATCH_SIZE)
    eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

    with strategy.scope():
        counter = harness.ExampleCounter(num_examples, id_scale=1 / 255)
        model = tf.keras.Sequential([
            tf.keras.Input((28, 28, 2)),
            counter,
            tf.keras.layers.Conv2D(32, 3, activation='relu'),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation='relu'),
            tf.keras.layers.Dense(10)
        ])

        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.001),
                      metrics=['accuracy'])

    checkpoint_dir = os.path.join(workdir, 'training_checkpoints')
    if harness.KERAS_3:
        checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch:04d}.weights.h5")
    else:
        checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch}")

    def decay(epoch):
        if epoch < 3:
            return 1e-3
        elif epoch >= 3 and epoch < 7:
            return 1e-4
        else:
            return 1e-5

    learning_rates = []

    class PrintLR(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            learning_rates.append(float(model.optimizer.learning_rate.numpy()))

    epoch_counts = harness.EpochCounts(counter, strategy)
    callbacks = [
        tf.keras.callbacks.TensorBoard(log_dir=os.path.join(workdir, 'logs')),
        tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix,
                                           save_weights_only=True),
        tf.keras.callbacks.LearningRateScheduler(decay),
        PrintLR(),
        epoch_counts,
    ]

    history = model.fit(train_dataset, epochs=EPOCHS, callbacks=callbacks, verbose=0)

    if harness.KERAS_3:
        latest_checkpoint = sorted(pathlib.Path(checkpoint_dir).glob('*'))[-1]
    else:
        latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
    model.load_weights(latest_checkpoint)
    (eval_loss, eval_acc), eval_counts = harness.counts_during(
        counter, strategy, "inference", lambda: model.evaluate(eval_dataset, verbose=0))

    path = os.path.join(workdir, 'my_model.keras')
    model.save(path)

    unreplicated_model = tf.keras.models.load_model(path)
    unreplicated_model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(),
        metrics=['accuracy'])
    unreplicated = unreplicated_model.evaluate(eval_dataset, verbose=0)

    with strategy.scope():
        replicated_model = tf.keras.models.load_model(path)
        replicated_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                 optimizer=tf.keras.optimizers.Adam(),
                                 metrics=['accuracy'])
        replicated = replicated_model.evaluate(eval_dataset, verbose=0)

    return harness.Record(
        train_counts=epoch_counts.per_epoch,
        inference_counts=[eval_counts],
        weights=model.get_weights(),
        values={
            "loss": history.history["loss"],
            "accuracy": history.history["accuracy"],
            "learning_rate": learning_rates,
            "checkpoints": len(os.listdir(checkpoint_dir)) if harness.KERAS_3 else EPOCHS,
            "evaluate": [eval_loss, eval_acc],
            "evaluate_unreplicated": unreplicated,
            "evaluate_replicated": replicated,
        },
    )


class TutorialUnderOneStrategy:
    """The tutorial run by one device and by `CONTENDER`, for a `ConformanceTestCase`.

    A mixin (not a test case itself): a test class inherits it before
    `harness.ConformanceTestCase` and sets `CONTENDER` (a
    `harness.make_strategy` name) for the strategies the main test below
    does not run.
    """

    CONTENDER: str

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        import tempfile  # noqa: PLC0415

        workdir = tempfile.mkdtemp(prefix=f"{cls.CONTENDER}_tutorial_")
        cls.records = {}
        for contender in ("one_device", cls.CONTENDER):
            keras.utils.set_random_seed(harness.SEED)
            directory = f"{workdir}/{contender}"
            tf.io.gfile.makedirs(directory)
            cls.records[contender] = harness.recorded(run_tutorial, contender, directory)

    def test_sees_every_training_example_once_per_epoch(self):
        self.assert_each_example_once_per_epoch(self.records[self.CONTENDER], 768, EPOCHS)

    def test_evaluates_every_test_example_once(self):
        expected = np.zeros(1797, np.int64)
        expected[768:] = 1
        self.assert_inference_counts(self.records[self.CONTENDER], [expected])

    def test_matches_one_device(self):
        self.assert_same_results(self.records[self.CONTENDER], self.records["one_device"])


class KerasTutorialTest(harness.ConformanceTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.records = cls.run_in_tempdir(run_tutorial)

    def test_tfdist_sees_every_training_example_once_per_epoch(self):
        self.assert_each_example_once_per_epoch(self.records["tfdist"], 768, EPOCHS)

    def test_tfdist_evaluates_every_test_example_once(self):
        expected = np.zeros(1797, np.int64)
        expected[768:] = 1
        self.assert_inference_counts(self.records["tfdist"], [expected])

    def test_tfdist_matches_one_device(self):
        self.assert_same_results(self.records["tfdist"], self.records["one_device"])

    @harness.needs_tf_contender
    def test_tf_strategy_matches_one_device_too(self):
        self.assert_same_results(self.records["tf"], self.records["one_device"])


if __name__ == "__main__":
    tfdist.testing.main()
