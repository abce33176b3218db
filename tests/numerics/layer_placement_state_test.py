"""LayerPlacementStrategy with state: BatchNormalization, rematerialization, checkpoints.

- BatchNormalization normalizes over each microbatch in training: with
  M = 1 training equals one device; with M > 1 it is asserted to differ
  from one device with the same global batch, and to equal one device that
  runs the same microbatches itself (ghost batch normalization: batch
  statistics per microbatch, moving statistics updated once per
  microbatch in order, gradients summed into one update).
- `rematerialize=True` recomputes activations without changing results;
  layers that update state (BatchNormalization, Dropout) are left out.
- Weights saved under the strategy load on one device and the other way
  round, before and after the model is placed.

Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1, under tf-keras.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist._internal import keras_layers
from tfdist.data import splitting
from tfdist.testing import numerics
from tests.numerics import placement_cases
from tests.front_end import KERAS_3

pytestmark = pytest.mark.model
keras = tf.keras
# Batch statistics over 7-8 rows amplify rounding (1/sqrt(variance)).
BATCH_NORM_ATOL = 1e-5


def _batch_norm_builder():
    def build():
        keras.utils.set_random_seed(4)
        return placement_cases.compiled(
            keras.Sequential([
                keras.Input((8,)),
                keras.layers.Dense(16),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(3),
            ]),
            "sgd",
        )

    return build


def _ghost_batch_norm_reference(model, x, y, *, num_microbatches, epochs):
    """One device training on microbatches itself (the stated behaviour)."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    batch = placement_cases.GLOBAL_BATCH_SIZE
    for _ in range(epochs):
        for start in range(0, len(x), batch):
            xb, yb = x[start:start + batch], y[start:start + batch]
            rows = len(xb)
            total = None
            for m in range(num_microbatches):
                lo, size = (int(v) for v in splitting.slice_bounds(tf.constant(rows, tf.int64), m, num_microbatches))
                with tf.GradientTape() as tape:
                    logits = model(xb[lo:lo + size], training=True)
                    loss = loss_fn(yb[lo:lo + size], logits) * (size / rows)
                grads = tape.gradient(loss, model.trainable_variables)
                total = grads if total is None else [a + b for a, b in zip(total, grads)]
            model.optimizer.apply_gradients(zip(total, model.trainable_variables))


def _assert_batch_norm_matches_one_device(num_microbatches, *, check_inference):
    x, y = placement_cases.data()
    numerics.assert_matches_single_device(
        _batch_norm_builder(),
        tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:3], num_microbatches=num_microbatches),
        x, y, global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
        rtol=placement_cases.FLOAT32_RTOL, atol=BATCH_NORM_ATOL, check_inference=check_inference,
    )


class BatchNormalizationTest(tf.test.TestCase):

    def test_one_microbatch_matches_one_device(self):
        _assert_batch_norm_matches_one_device(1, check_inference=True)

    def test_microbatches_differ_from_one_device_with_the_global_batch(self):
        with self.assertRaisesRegex(AssertionError, "differ beyond"):
            _assert_batch_norm_matches_one_device(4, check_inference=False)

    def test_microbatches_equal_ghost_batch_norm_on_one_device(self):
        x, y = placement_cases.data()
        build = _batch_norm_builder()
        reference = build()
        initial = reference.get_weights()
        _ghost_batch_norm_reference(reference, x, y, num_microbatches=4, epochs=2)
        strategy = tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:3], num_microbatches=4)
        with strategy.scope():
            model = build()
        model.set_weights(initial)
        model.fit(x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0)
        numerics.assert_weights_close(  # Moving mean and variance included.
            model, reference, rtol=placement_cases.FLOAT32_RTOL, atol=BATCH_NORM_ATOL
        )


class RematerializeTest(tf.test.TestCase):

    def test_rematerialized_training_matches_one_device(self):
        def build():
            keras.utils.set_random_seed(6)
            blocks = [
                keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(8)], name=f"block{i}")
                for i in range(3)
            ]
            return placement_cases.compiled(
                keras.Sequential([keras.Input((8,)), *blocks, keras.layers.Dense(3)]), "adam"
            )

        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(
            placement_cases.DEVICES[:2], num_microbatches=2, rematerialize=True
        )
        numerics.assert_matches_single_device(
            build, strategy, x, y, global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL, check_inference=True,
        )
        rematerialized = strategy.placement_report().rematerialized
        self.assertLen(rematerialized, 4)
        self.assertEqual(rematerialized[:3], ("block0", "block1", "block2"))

    def test_layers_with_state_updates_are_not_rematerialized(self):
        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(
            placement_cases.DEVICES[:2], num_microbatches=1, rematerialize=True
        )
        numerics.assert_matches_single_device(
            _batch_norm_builder(), strategy, x, y,
            global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=1,
            rtol=placement_cases.FLOAT32_RTOL, atol=BATCH_NORM_ATOL, check_inference=False,
        )
        rematerialized = strategy.placement_report().rematerialized
        self.assertLen(rematerialized, 3)
        self.assertNotIn("batch_normalization", " ".join(rematerialized))


class CheckpointTest(tf.test.TestCase):

    def _path(self):
        name = "model.weights.h5" if KERAS_3 else "ckpt"  # tf-keras: TF format.
        return os.path.join(self.create_tempdir().full_path, name)

    def _strategy(self):
        return tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:3], num_microbatches=2)

    def test_weights_saved_under_the_strategy_load_on_one_device(self):
        x, y = placement_cases.data()
        build = placement_cases.mlp_builder("adam")
        with self._strategy().scope():
            placed = build()
        placed.fit(x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=1, verbose=0)
        path = self._path()
        placed.save_weights(path)
        single = build()
        single.load_weights(path)
        numerics.assert_weights_close(single, placed, rtol=0, atol=0)
        self.assertAllClose(single.predict(x, verbose=0), placed.predict(x, verbose=0),
                            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL)

    def test_one_device_weights_load_under_the_strategy_before_and_after_placement(self):
        x, y = placement_cases.data()
        build = placement_cases.mlp_builder("adam")
        single = build()
        single.fit(x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=1, verbose=0)
        path = self._path()
        single.save_weights(path)
        strategy = self._strategy()
        with strategy.scope():
            before = build()  # Variables still on the host.
            before.load_weights(path)
        numerics.assert_weights_close(before, single, rtol=0, atol=0)
        self.assertAllClose(before.predict(x, verbose=0), single.predict(x, verbose=0),
                            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL)
        with strategy.scope():
            after = build()
        after.fit(x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=1, verbose=0)  # Placed.
        devices = [v.device for v in keras_layers.resource_variables(after)]
        after.load_weights(path)
        numerics.assert_weights_close(after, single, rtol=0, atol=0)
        self.assertEqual([v.device for v in keras_layers.resource_variables(after)], devices)
        self.assertLen(set(devices), 3)


if __name__ == "__main__":
    tfdist.testing.main()
