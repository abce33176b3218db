"""Tutorial "Multi-worker training with Keras", ported (one process, TF's MWMS, tfdist's).

Source: tensorflow/docs site/en/tutorials/distribute/multi_worker_with_keras.ipynb
(TF 2.21). Kept as written: `mnist_setup.mnist_dataset` (an unseeded
`shuffle(60000).repeat().batch(global_batch_size)`), the model of
`build_and_compile_cnn_model` (SGD 0.001), 64 examples per worker, `main.py`
(strategy from TF_CONFIG, model built in its scope, `fit(epochs=...,
steps_per_epoch=...)`), on 2 worker processes on 127.0.0.1. Changed: bundled
digits instead of MNIST (`harness.load_mnist_like`, with its id channel and
`ExampleCounter` in front of the model, so the model starts with
`tf.keras.Input(shape=(28, 28, 2))` instead of `InputLayer(input_shape=(28,
28))`, which Keras 3 and tf-keras spell differently), 512 examples and steps_per_epoch = 4
(one pass over the data per epoch, so "every example once per epoch" is
defined), 2 epochs, results returned instead of printed.

Two runs per strategy: as written (unseeded: every worker's copy of the
pipeline would shuffle differently), and with `keras.utils.set_random_seed`
at the start of every process, where the result must equal one process
training on the same global batch from the same seed. The seeded run does
not reshuffle between epochs (`reshuffle_each_iteration=False`): under any
strategy, Keras 3's `fit` first reads one batch from an iterator it then
drops, and that iterator's background prefetch can run past the end of
`shuffle().repeat()` and draw the next epoch's seed from the shuffle's seed
generator (shared by all iterators) before the training iterator does, so
which order an epoch gets is a race (seen with TF's OneDeviceStrategy).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]
keras = tf.keras

NUM_TRAIN = 512
PER_WORKER_BATCH_SIZE = 64
GLOBAL_BATCH_SIZE = PER_WORKER_BATCH_SIZE * harness.NUM_WORKERS
STEPS_PER_EPOCH = NUM_TRAIN // GLOBAL_BATCH_SIZE
EPOCHS = 2


def mnist_dataset(batch_size, reshuffle=True):
    (x_train, y_train), _ = harness.load_mnist_like(num_train=NUM_TRAIN)
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(60000, reshuffle_each_iteration=reshuffle).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model(counter):
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28, 2)),
        counter,
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=['accuracy'])
    return model


def main(contender: str, seeded: bool) -> harness.Record:
    """The tutorial's main.py, for one worker of `contender` (or one process)."""
    if seeded:
        tf.keras.utils.set_random_seed(harness.SEED)
    strategy = harness.make_strategy(contender)
    multi_worker_dataset = mnist_dataset(GLOBAL_BATCH_SIZE, reshuffle=not seeded)
    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        counter = harness.ExampleCounter(1797, id_scale=1 / 255)
        multi_worker_model = build_and_compile_cnn_model(counter)
    epoch_counts = harness.EpochCounts(counter, strategy)
    history = multi_worker_model.fit(
        multi_worker_dataset, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH,
        callbacks=[epoch_counts], verbose=0)
    values = {"loss": history.history["loss"], "accuracy": history.history["accuracy"]}
    if not seeded:  # The seeded run's values are compared with one process's.
        values["transport"] = getattr(strategy, "transport", None)
    return harness.Record(
        train_counts=epoch_counts.per_epoch,
        weights=multi_worker_model.get_weights(),
        values=values,
    )


def worker(contender: str, seeded: bool) -> harness.Record:
    """One task of the cluster (run by `harness.run_on_cluster`)."""
    return harness.recorded(lambda c, _: main(c, seeded), contender, "")


class MultiWorkerKerasTutorialTest(harness.ConformanceTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.reference = harness.recorded(lambda c, _: main(c, True), "one_device", "")
        cls.tfdist = harness.run_on_cluster(worker, "tfdist_multi_worker", False)
        cls.tfdist_seeded = harness.run_on_cluster(worker, "tfdist_multi_worker", True)
        cls.tf = harness.run_on_cluster(
            worker, "tf_multi_worker", False) if harness.TF_CONTENDER else None

    def test_tfdist_workers_see_every_example_once_per_epoch_unseeded(self):
        self.assert_workers_saw_each_example_once_per_epoch(self.tfdist, NUM_TRAIN, EPOCHS)
        self.assert_workers_agree(self.tfdist)

    def test_tfdist_workers_on_one_host_sum_through_shared_memory(self):
        # The tutorial's own code, unchanged: the default transport takes it.
        for record in self.tfdist:
            self.assert_ran(record)
            self.assertEqual(record.values["transport"], "host_memory")

    def test_tfdist_seeded_run_equals_one_process(self):
        self.assert_workers_saw_each_example_once_per_epoch(self.tfdist_seeded, NUM_TRAIN, EPOCHS)
        for record in self.tfdist_seeded:
            self.assert_same_results(record, self.reference)

    @harness.needs_tf_contender
    @pytest.mark.skipif(not harness.KERAS_3, reason="Keras 3 only: tf-keras runs TF's MWMS")
    def test_tf_strategy_fails_under_keras3(self):
        # Keras 3's Trainer reduces a nested batch with strategy.reduce,
        # which TF's MWMS does not map over ("Attempt to convert a value
        # (PerReplica...)").
        for record in self.tf:
            self.assertIsNotNone(record.error)
            self.assertIn("PerReplica", record.error)

    @harness.needs_tf_contender
    @pytest.mark.skipif(harness.KERAS_3, reason="tf-keras only: TF's MWMS fails under Keras 3")
    def test_tf_strategy_loses_and_repeats_examples_under_tf_keras(self):
        # TF auto-shards by data: each worker keeps its share of its own
        # copy, and the copies' unseeded shuffles disagree.
        for record in self.tf:
            self.assert_ran(record)
        first_epoch = sum(r.train_counts[0] for r in self.tf)[:NUM_TRAIN]
        self.assertFalse(np.all(first_epoch == 1), "TF's MWMS saw each example once")


if __name__ == "__main__":
    tfdist.testing.main()
