"""TrainingState: commits are atomic, restores fill the optimizer too, only the writer writes."""

from __future__ import annotations

import os
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.elastic import training_state

pytestmark = [pytest.mark.model]


def _trained_model():
    model = tfdist.testing.small_classifier(tf.keras.optimizers.SGD(0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    y = rng.integers(0, 3, 32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    return model


def _optimizer_values(model):
    return [np.array(v) for v in model.optimizer.variables]


class TrainingStateTest(tf.test.TestCase):
    def test_restore_fills_a_fresh_model_and_its_unbuilt_optimizer(self):
        backup = self.create_tempdir().full_path
        trained = _trained_model()
        position = training_state.Position(epoch=2, step=3, data_epoch=4, steps_done=19)
        training_state.TrainingState(trained, backup, is_writer=True).commit(position)

        fresh = tfdist.testing.small_classifier(tf.keras.optimizers.SGD(0.1, momentum=0.9), seed=5)
        restored = training_state.TrainingState(fresh, backup, is_writer=True).restore()

        self.assertEqual(restored, position)
        for a, b in zip(trained.get_weights(), fresh.get_weights()):
            self.assertAllEqual(a, b)
        for a, b in zip(_optimizer_values(trained), _optimizer_values(fresh)):
            self.assertAllEqual(a, b)  # Iterations and momentums.

    def test_restoring_into_a_model_without_variables_raises_config_error(self):
        backup = self.create_tempdir().full_path
        training_state.TrainingState(_trained_model(), backup, is_writer=True).commit(
            training_state.Position(epoch=1, step=2)
        )
        keras = tf.keras
        unbuilt = keras.Sequential([keras.layers.Dense(3)])  # No input shape yet.
        unbuilt.compile(keras.optimizers.SGD(0.1), "mse")
        with self.assertRaisesRegex(tfdist.errors.ConfigError, "has no variables yet.*keras.Input"):
            training_state.TrainingState(unbuilt, backup, is_writer=True).restore()

    def test_nothing_committed_restores_nothing(self):
        state = training_state.TrainingState(
            _trained_model(), self.create_tempdir().full_path, is_writer=True
        )
        self.assertIsNone(state.restore())
        self.assertIsNone(state.latest_directory())

    def test_a_commit_that_fails_leaves_the_previous_state_latest(self):
        backup = self.create_tempdir().full_path
        model = _trained_model()
        state = training_state.TrainingState(model, backup, is_writer=True)
        state.commit(training_state.Position(epoch=1, step=0))
        with mock.patch.object(training_state.json, "dump", side_effect=OSError("disk full")):
            with self.assertRaisesRegex(OSError, "disk full"):
                state.commit(training_state.Position(epoch=1, step=5))
        self.assertEqual(state.restore(), training_state.Position(epoch=1, step=0))

    def test_a_later_commit_replaces_the_earlier_one(self):
        backup = self.create_tempdir().full_path
        state = training_state.TrainingState(_trained_model(), backup, is_writer=True)
        state.commit(training_state.Position(epoch=0, step=2))
        state.commit(training_state.Position(epoch=0, step=4))
        self.assertEqual(state.restore(), training_state.Position(epoch=0, step=4))
        self.assertLen([n for n in os.listdir(backup) if n.startswith("state-")], 1)

    def test_a_non_writer_leaves_the_backup_dir_alone(self):
        backup = os.path.join(self.create_tempdir().full_path, "backup")
        state = training_state.TrainingState(_trained_model(), backup, is_writer=False)
        state.commit(training_state.Position(epoch=0, step=2))
        self.assertFalse(os.path.exists(backup))
        state.delete()



class SurvivorStateTest(tf.test.TestCase):
    """States a task wrote after a lost peer (`write_survivor`): the newest one restores."""

    def test_the_newest_of_the_commit_and_the_survivors_restores(self):
        backup = self.create_tempdir().full_path
        trained = _trained_model()
        committed = training_state.Position(epoch=1, step=2, steps_done=10)
        behind = training_state.Position(epoch=1, step=4, steps_done=12)
        newest = training_state.Position(epoch=1, step=5, steps_done=13)
        training_state.TrainingState(trained, backup, is_writer=True).commit(committed)
        # Any task writes, not only the writer; each its own directory.
        training_state.TrainingState(trained, backup, is_writer=False).write_survivor("worker:2", newest)
        training_state.TrainingState(trained, backup, is_writer=False).write_survivor("worker:1", behind)

        fresh = tfdist.testing.small_classifier(tf.keras.optimizers.SGD(0.1, momentum=0.9), seed=5)
        state = training_state.TrainingState(fresh, backup, is_writer=True)
        self.assertEqual(os.path.basename(state.latest_directory()), "survivor-worker-2")
        self.assertEqual(state.restore(), newest)
        for a, b in zip(trained.get_weights(), fresh.get_weights()):
            self.assertAllEqual(a, b)

    def test_a_commit_wins_a_tie_and_removes_the_survivors(self):
        backup = self.create_tempdir().full_path
        model = _trained_model()
        state = training_state.TrainingState(model, backup, is_writer=True)
        state.commit(training_state.Position(epoch=0, step=3, steps_done=3))
        state.write_survivor("worker:0", training_state.Position(epoch=0, step=3, steps_done=3))
        self.assertEqual(os.path.basename(state.latest_directory()), "state-1")

        state.write_survivor("worker:0", training_state.Position(epoch=0, step=5, steps_done=5))
        self.assertEqual(state.restore(), training_state.Position(epoch=0, step=5, steps_done=5))
        os.mkdir(os.path.join(backup, ".survivor-killed-mid-write"))
        state.commit(training_state.Position(epoch=0, step=6, steps_done=6))
        self.assertEqual(sorted(os.listdir(backup)), ["latest", "state-2"])

    def test_a_survivor_write_that_fails_leaves_nothing_to_restore(self):
        backup = self.create_tempdir().full_path
        state = training_state.TrainingState(_trained_model(), backup, is_writer=False)
        with mock.patch.object(training_state.json, "dump", side_effect=OSError("disk full")):
            with self.assertRaisesRegex(OSError, "disk full"):
                state.write_survivor("worker:1", training_state.Position(epoch=0, step=1, steps_done=1))
        self.assertIsNone(state.latest_directory())
        self.assertEqual(os.listdir(backup), [])


if __name__ == "__main__":
    tf.test.main()
