"""A small classifier that counts the examples it trains on, for the parameter-server tests.

Every example carries its id in feature column 0, and a layer in front of
the model adds one to a counter variable (on a ps, updated atomically by
whichever worker runs the step) per id it trains on: a test reads exactly
which examples were trained on, how often.
"""

from __future__ import annotations

import traceback

import numpy as np
import tensorflow as tf

from tests.front_end import KERAS_3

NUM_EXAMPLES = 200  # 7 batches of 32: a short last batch of 8.
BATCH_SIZE = 32
NUM_BATCHES = 7
NUM_FEATURES = 6


def data() -> tuple[np.ndarray, np.ndarray]:
    """Features whose column 0 is the example id; labels from a fixed rule."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, NUM_FEATURES)).astype("float32")
    x[:, 0] = np.arange(NUM_EXAMPLES)
    y = (x[:, 1] + x[:, 2] > 0).astype("int32")
    return x, y


def count_ids(keras, num_examples: int = NUM_EXAMPLES):
    """A layer counting, in a variable (`counts`), the ids (column 0) of the examples it trains on.

    It passes the other columns on; at inference it counts nothing.
    """

    class CountIds(keras.layers.Layer):
        def build(self, input_shape):
            self.counts = tf.Variable(
                tf.zeros([num_examples], tf.int32), trainable=False, name="counts"
            )

        def call(self, inputs, training=None):
            if training:
                ids = tf.cast(inputs[:, 0], tf.int32)
                seen = tf.math.bincount(
                    ids, minlength=num_examples, maxlength=num_examples, dtype=tf.int32
                )
                with tf.control_dependencies([self.counts.assign_add(seen)]):
                    return tf.identity(inputs[:, 1:])
            return inputs[:, 1:]

    return CountIds()


def build(keras, strategy, *, steps_per_execution: int = 1):
    """A small classifier whose first layer counts the ids it trains on."""

    class CountExamples(keras.metrics.Metric):
        def __init__(self, **kwargs):
            super().__init__(name="examples", **kwargs)
            self.total = self.add_weight(name="total", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.total.assign_add(tf.cast(tf.shape(y_true)[0], self.total.dtype))

        def result(self):
            return tf.identity(self.total)  # A read: Keras keeps the result.

    with strategy.scope():
        counter = count_ids(keras)
        model = keras.Sequential(
            [
                keras.Input((NUM_FEATURES,)),
                counter,
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy", CountExamples()],
            steps_per_execution=steps_per_execution,
        )
    return model, counter


def run_scenario(record: dict, name: str, run) -> None:
    """record[name] = run(), or {"error": the exception and its traceback} (for the test to report)."""
    try:
        record[name] = run()
    except Exception as e:  # noqa: BLE001 - reported to the test.
        record[name] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
