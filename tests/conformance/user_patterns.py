"""The model, data and fitting that the user-pattern conformance tests share.

Every pattern runs on the same small model (the flat digits with their id
read by `ExampleCounter`, a `Dense(32)` and a `Dense(10)` from logits,
Adam) and the same data (`harness.load_mnist_like`: 256 training and 128
test examples, global batch 32), each contender from the same seed.
"""

from __future__ import annotations

import tensorflow as tf

from tests.conformance import harness

keras = tf.keras
NUM_TRAIN = 256
NUM_TEST = 128
BATCH_SIZE = 32
EPOCHS = 2


def load_data():
    """Flat digits scaled to [0, 1]: (x_train, y_train), (x_test, y_test)."""
    (train_images, y_train), (test_images, y_test) = harness.load_mnist_like(
        num_train=NUM_TRAIN, num_test=NUM_TEST)
    return (harness.flat_images(train_images) / 255, y_train), (
        harness.flat_images(test_images) / 255, y_test)


def build_model(strategy, *middle, model_class=keras.Sequential, **compile_kwargs):
    """The patterns' model, `middle` layers after the first Dense, compiled under the scope."""
    with strategy.scope():
        layers = [
            keras.Input((785,)),
            harness.ExampleCounter(harness.NUM_DIGITS, id_scale=1 / 255),
            keras.layers.Dense(32, activation="relu"),
            *middle,
            keras.layers.Dense(10),
        ]
        if model_class is keras.Sequential:
            model = keras.Sequential(layers)
        else:  # A functional model of a subclass of keras.Model.
            outputs = layers[0]
            for layer in layers[1:]:
                outputs = layer(outputs)
            model = model_class(layers[0], outputs)
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            **compile_kwargs)
    return model


def train_dataset(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(NUM_TRAIN).batch(BATCH_SIZE)


def fit_dataset(contender, record, *middle, model_class=keras.Sequential, compile_kwargs=None, **fit_kwargs):
    """Builds the model and fits it on the shuffled training dataset, recording all."""
    strategy = harness.make_strategy(contender)
    (x_train, y_train), _ = load_data()
    model = build_model(strategy, *middle, model_class=model_class, **(compile_kwargs or {}))
    fit_kwargs.setdefault("x", train_dataset(x_train, y_train))
    record.values["history"] = harness.fit_counting(
        model, strategy, record, epochs=EPOCHS, verbose=0, **fit_kwargs)
    record.weights = model.get_weights()


def named(names):
    """`named_parameters` cases whose name is the scenario's."""
    return [(name, name) for name in names]


class CustomModel(keras.Model):
    """The Keras guide's `train_step` override, in the front end's own form."""

    def train_step(self, data):
        if harness.KERAS_3:
            return self.keras3_train_step(data)
        return self.tf_keras_train_step(data)

    def keras3_train_step(self, data):
        # Unpack the data. Its structure depends on your model and
        # on what you pass to `fit()`.
        x, y = data

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            # Compute the loss value
            # (the loss function is configured in `compile()`)
            loss = self.compute_loss(y=y, y_pred=y_pred)

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)

        # Update weights
        self.optimizer.apply(gradients, trainable_vars)

        # Update metrics (includes the metric that tracks the loss)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)

        # Return a dict mapping metric names to current value
        return {m.name: m.result() for m in self.metrics}

    def tf_keras_train_step(self, data):
        # Unpack the data. Its structure depends on your model and
        # on what you pass to `fit()`.
        x, y = data

        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            # Compute the loss value
            # (the loss function is configured in `compile()`)
            loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)

        # Compute gradients
        trainable_vars = self.trainable_variables
        gradients = tape.gradient(loss, trainable_vars)
        # Update weights
        self.optimizer.apply_gradients(zip(gradients, trainable_vars))
        # Update metrics (includes the metric that tracks the loss)
        self.compiled_metrics.update_state(y, y_pred)
        # Return a dict mapping metric names to current value
        return {m.name: m.result() for m in self.metrics}


class TokenAndPositionEmbedding(keras.layers.Layer):
    """keras-io's transformer embedding: a token embedding plus one of `range(maxlen)`.

    As in "Text classification with Transformer" (its `ops.arange` written
    as `tf.range`, which both front ends take): the position lookup's
    indices are constants, the same whatever the batch.
    """

    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = x.shape[-1]
        positions = self.pos_emb(tf.range(start=0, limit=maxlen, delta=1))
        return self.token_emb(x) + positions
