"""tfdist's uses of Keras internals: the shapes they rely on still hold.

`redirect_non_chief_checkpoints` patches Keras 3's callback classes for the
whole process (it is meant for non-chief tasks), so it runs in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist._internal import keras_compat

keras = tf.keras

_NON_CHIEF_SAVE = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import keras
    from tfdist._internal import keras_compat

    directory = sys.argv[1]
    if sys.argv[2] == "redirect":
        keras_compat.redirect_non_chief_checkpoints("worker:1")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.ones((8, 4)), np.ones((8, 2)), epochs=2, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(os.path.join(directory, "ckpt.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.BackupAndRestore(os.path.join(directory, "backup")),
    ])
    print("FILES", sorted(os.listdir(directory)))
    """
)


_KERAS_3 = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() not in ("1", "true")


class NonChiefCheckpointTest(tf.test.TestCase):
    """Keras 3 only: tf-keras keeps non-chief checkpoints apart itself."""
    def _files_written(self, mode: str) -> str:
        directory = self.create_tempdir().full_path
        result = subprocess.run(
            [sys.executable, "-c", _NON_CHIEF_SAVE, directory, mode],
            capture_output=True, text=True, timeout=120,
        )
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        return next(l for l in result.stdout.splitlines() if l.startswith("FILES"))

    def test_a_non_chief_task_writes_no_checkpoint_where_the_chief_does(self):
        self.assertEqual(self._files_written("redirect"), "FILES []")

    def test_without_the_redirect_keras_writes_there(self):
        self.assertEqual(self._files_written("plain"), "FILES ['ckpt.weights.h5']")


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
        if _KERAS_3:  # tf-keras's predict step needs no help, so is not looked for.
            self.assertIn(("predict", True), kinds)
        for step in seen:
            if step is not None:
                self.assertIs(step.model, model)

    def test_a_custom_loop_step_is_not_a_keras_step(self):
        self.assertIsNone(keras_compat.keras_step(lambda x: x))


if __name__ == "__main__":
    tfdist.testing.main()
