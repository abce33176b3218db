"""tfdist's uses of Keras internals: the shapes they rely on still hold.

`redirect_non_chief_checkpoints` changes Keras 3's callback classes while
it is held, for the models of the strategy it is given only.
"""

from __future__ import annotations

import contextlib
import os
import unittest

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.front_end import KERAS_3
from tfdist._internal import keras_compat

keras = tf.keras

@unittest.skipUnless(KERAS_3, "tf-keras keeps non-chief checkpoints apart itself")
class NonChiefCheckpointTest(tf.test.TestCase):
    """Keras 3's checkpoint callbacks on a non-chief task, for its strategy's models only."""

    def _files_written(self, strategy) -> list[str]:
        directory = self.create_tempdir().full_path
        with strategy.scope() if strategy is not None else contextlib.nullcontext():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            model.compile(optimizer="sgd", loss="mse")
        model.fit(np.ones((8, 4)), np.ones((8, 2)), epochs=2, verbose=0, callbacks=[
            keras.callbacks.ModelCheckpoint(os.path.join(directory, "ckpt.weights.h5"),
                                            save_weights_only=True),
            keras.callbacks.BackupAndRestore(os.path.join(directory, "backup")),
        ])
        return sorted(os.listdir(directory))

    def test_the_non_chief_strategys_models_write_no_checkpoint(self):
        non_chief = tf.distribute.OneDeviceStrategy("/cpu:0")
        release = keras_compat.redirect_non_chief_checkpoints(non_chief, "worker:1")
        try:
            self.assertEqual(self._files_written(non_chief), [])
            # Plain Keras beside it: a model of no strategy writes, as without tfdist.
            self.assertEqual(self._files_written(None), ["ckpt.weights.h5"])
        finally:
            release()

    def test_keras_is_as_it_was_once_released(self):
        methods = [
            (keras.callbacks.BackupAndRestore, "_save_model"),
            (keras.callbacks.BackupAndRestore, "on_train_end"),
            (keras.callbacks.ModelCheckpoint, "_save_model"),
        ]
        before = [vars(cls)[name] for cls, name in methods]
        non_chief = tf.distribute.OneDeviceStrategy("/cpu:0")
        release = keras_compat.redirect_non_chief_checkpoints(non_chief, "worker:1")
        self.assertNotEqual([vars(cls)[name] for cls, name in methods], before)
        release()
        self.assertEqual([vars(cls)[name] for cls, name in methods], before)
        self.assertEqual(self._files_written(non_chief), ["ckpt.weights.h5"])


@pytest.mark.model
class KerasStepTest(tf.test.TestCase):
    """Recognising Keras's own steps in strategy.run: Keras's shape, checked."""

    def test_keras_fit_train_step_is_recognised_as_builtin(self):
        seen = []

        class Spy(tfdist.MirroredStrategy):
            def run(self, fn, args=(), kwargs=None, options=None):
                seen.append(keras_compat.keras_step(fn))
                return super().run(fn, args, kwargs, options)

        strategy = Spy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = tfdist.testing.small_classifier(keras.optimizers.SGD(0.1))
        x = np.zeros((8, 8), np.float32)
        y = np.zeros((8,), np.int32)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        model.predict(x, batch_size=4, verbose=0)
        kinds = {(step.kind, step.builtin) for step in seen if step is not None}
        self.assertIn(("train", True), kinds)
        if KERAS_3:  # tf-keras's predict step needs no help, so is not looked for.
            self.assertIn(("predict", True), kinds)
        for step in seen:
            if step is not None:
                self.assertIs(step.model, model)

    def test_a_custom_loop_step_is_not_a_keras_step(self):
        self.assertIsNone(keras_compat.keras_step(lambda x: x))


if __name__ == "__main__":
    tfdist.testing.main()
