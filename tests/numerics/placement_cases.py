"""What the LayerPlacementStrategy numerics tests share: data, models, tolerances.

Every model is built and compiled by a function that seeds Keras first, so
a call under the strategy's scope and one outside start from the same
weights (the tests copy them anyway).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

keras = tf.keras

# The same examples and initial weights; the only difference is how float32
# sums are grouped (microbatch gradients added, instead of one matmul over
# the batch), a few ulps per step.
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-6
DEVICES = [f"/cpu:{i}" for i in range(4)]
# 130 rows in batches of 30: microbatches of 8/8/7/7 rows for M = 4, and a
# last batch of 10 rows.
NUM_EXAMPLES = 130
GLOBAL_BATCH_SIZE = 30


def data(num_examples=NUM_EXAMPLES, seed=0):
    """`(x, y)`: 8 float features, 3 classes."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_examples, 8)).astype("float32")
    y = rng.integers(0, 3, num_examples).astype("int32")
    return x, y


def optimizer(name):
    """SGD with momentum ("sgd") or Adam ("adam")."""
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    return keras.optimizers.Adam(learning_rate=0.01)


def compiled(model, optimizer_name="sgd"):
    """`model` compiled with sparse cross-entropy on logits and accuracy."""
    model.compile(
        optimizer=optimizer(optimizer_name),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def mlp_builder(optimizer_name):
    """Builds 8 -> 4 x Dense(16, relu) -> 3: five layers, enough for 4 stages."""
    def build():
        keras.utils.set_random_seed(1)
        return compiled(
            keras.Sequential(
                [keras.Input((8,))]
                + [keras.layers.Dense(16, activation="relu") for _ in range(4)]
                + [keras.layers.Dense(3)]
            ),
            optimizer_name,
        )

    return build
