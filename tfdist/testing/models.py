"""A tiny compiled classifier for equivalence tests of strategies.

    model = tfdist.testing.small_classifier(tf.keras.optimizers.SGD(0.1))

8 input features -> Dense(16, relu) -> Dense(3) logits, sparse categorical
cross-entropy, accuracy; weights drawn from a fixed seed, so two calls (one
under a strategy's scope, one outside) start from the same weights.
`small_embedding_classifier` is the same for sparse gradients: 5 token ids
-> Embedding -> mean -> 2 logits.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["small_classifier", "small_embedding_classifier"]

#: Input features and classes of `small_classifier`.
NUM_FEATURES = 8
NUM_CLASSES = 3


def small_classifier(optimizer: Any, *, seed: int = 1) -> Any:
    """Returns a compiled 8 -> 16 -> 3 classifier of the active Keras.

    Call it inside `strategy.scope()` for a distributed model. Uses
    `tf.keras` (Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1).

    Args:
      optimizer: A Keras optimizer instance of the same Keras (one per model).
      seed: Seed of the initial weights (`keras.utils.set_random_seed`).
    """
    # Any: Keras 3 and tf-keras models and optimizers share no base class.
    keras = tf.keras
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((NUM_FEATURES,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


#: Vocabulary and ids per example of `small_embedding_classifier`.
VOCABULARY_SIZE = 50
NUM_TOKENS = 5


def small_embedding_classifier(optimizer: Any, *, seed: int = 2) -> Any:
    """Returns a compiled classifier of 5 int32 ids with an Embedding (sparse gradients).

    Args:
      optimizer: A Keras optimizer instance of the same Keras (one per model).
      seed: Seed of the initial weights.
    """
    keras = tf.keras
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((NUM_TOKENS,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY_SIZE, 4),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model
