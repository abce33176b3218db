"""What users write beyond the tutorials, on 2 workers: every example once per epoch.

Patterns whose pipelines would give each worker a different copy:
- Keras `fit(x, y)` on numpy arrays with its default `shuffle=True` (Keras
  shuffles with an unseeded `tf.random.shuffle` inside its pipeline);
- a `Dataset.from_generator` whose Python generator yields in random order;
- a plain `shuffle(n)` without a seed in `experimental_distribute_dataset`'s
  custom loop.
tfdist reads the first two from the chief (tf.data service) and gives the
third a seed every worker shares; in each, the 2 workers together must see
every example exactly once per epoch and end with the same weights, and
`predict` on an uneven number of rows must return every row once, in order.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]
keras = tf.keras

NUM_TRAIN = 320
GLOBAL_BATCH_SIZE = 64
EPOCHS = 2


def _numpy_fit(strategy, x, y):
    with strategy.scope():
        counter = harness.ExampleCounter(1797)
        model = harness.counting_classifier(counter)
    epoch_counts = harness.EpochCounts(counter, strategy)
    model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=EPOCHS, callbacks=[epoch_counts], verbose=0)
    predictions = model.predict(x[:37], batch_size=GLOBAL_BATCH_SIZE, verbose=0)
    return epoch_counts.per_epoch, model.get_weights(), predictions, model.predict_on_batch(x[:37])


def _generator_fit(strategy, x, y):
    def examples():
        order = list(range(len(x)))
        random.shuffle(order)
        for i in order:
            yield x[i], y[i]

    dataset = tf.data.Dataset.from_generator(
        examples,
        output_signature=(tf.TensorSpec((28, 28, 2), tf.float32), tf.TensorSpec((), tf.uint8)),
    ).batch(GLOBAL_BATCH_SIZE)
    with strategy.scope():
        counter = harness.ExampleCounter(1797)
        model = harness.counting_classifier(counter)
    epoch_counts = harness.EpochCounts(counter, strategy)
    model.fit(dataset, epochs=EPOCHS, callbacks=[epoch_counts], verbose=0)
    return epoch_counts.per_epoch, model.get_weights()


def _custom_loop_ids(strategy, x):
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(len(x))).shuffle(len(x)).batch(GLOBAL_BATCH_SIZE)
    distributed = strategy.experimental_distribute_dataset(dataset)
    epochs = []
    for _ in range(EPOCHS):
        counts = np.zeros(1797, np.int64)
        for batch in distributed:
            for local in strategy.experimental_local_results(batch):
                np.add.at(counts, local.numpy(), 1)
        epochs.append(counts)
    return epochs


def worker(contender: str, workdir: str) -> dict[str, harness.Record]:
    """One task: the three patterns with one strategy (run by `run_on_cluster`)."""
    del workdir
    strategy = harness.make_strategy(contender)  # First: it starts TF's runtime.
    (x, y), _ = harness.load_mnist_like(num_train=NUM_TRAIN)
    records = {}
    try:
        counts, weights, predictions, reference = _numpy_fit(strategy, x, y)
        records["numpy"] = harness.Record(
            train_counts=counts, weights=weights,
            values={"predict": predictions, "predict_on_batch": reference})
    except Exception as e:  # noqa: BLE001 - recorded for the test to report.
        records["numpy"] = harness.Record(error=f"{type(e).__name__}: {e}")
    try:
        counts, weights = _generator_fit(strategy, x, y)
        records["generator"] = harness.Record(train_counts=counts, weights=weights)
    except Exception as e:  # noqa: BLE001
        records["generator"] = harness.Record(error=f"{type(e).__name__}: {e}")
    try:
        records["custom_loop"] = harness.Record(train_counts=_custom_loop_ids(strategy, x))
    except Exception as e:  # noqa: BLE001
        records["custom_loop"] = harness.Record(error=f"{type(e).__name__}: {e}")
    return records


class MultiWorkerUserPatternsTest(harness.ConformanceTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workers = harness.run_on_cluster(worker, "tfdist_multi_worker", "")

    def _pattern(self, name):
        return [records[name] for records in self.workers]

    def test_numpy_fit_with_keras_shuffling_sees_every_example_once(self):
        self.assert_workers_saw_each_example_once_per_epoch(self._pattern("numpy"), NUM_TRAIN, EPOCHS)
        self.assert_workers_agree(self._pattern("numpy"))

    def test_predict_on_uneven_rows_returns_every_row_in_order(self):
        for record in self._pattern("numpy"):
            self.assertEqual(record.values["predict"].shape, (37, 10))
            self.assertAllClose(record.values["predict"], record.values["predict_on_batch"], rtol=1e-5, atol=1e-6)

    def test_random_order_generator_sees_every_example_once(self):
        self.assert_workers_saw_each_example_once_per_epoch(self._pattern("generator"), NUM_TRAIN, EPOCHS)
        self.assert_workers_agree(self._pattern("generator"))

    def test_unseeded_shuffle_in_custom_loop_sees_every_example_once(self):
        self.assert_workers_saw_each_example_once_per_epoch(self._pattern("custom_loop"), NUM_TRAIN, EPOCHS)


if __name__ == "__main__":
    tfdist.testing.main()
