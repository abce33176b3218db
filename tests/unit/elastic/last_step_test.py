"""LastStep: the state kept at a step end is what a survivor saves, whatever ran after it."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.elastic import last_step
from tfdist.elastic import training_state

pytestmark = [pytest.mark.model]


def _fit_one_epoch(model, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(32, 8)).astype("float32")
    y = rng.integers(0, 3, 32)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)


class LastStepTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.strategy = tfdist.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with self.strategy.scope():
            self.model = tfdist.testing.small_classifier(tf.keras.optimizers.SGD(0.1, momentum=0.9))
        _fit_one_epoch(self.model, seed=0)
        self.variables = training_state.variables(self.model)

    def test_save_writes_the_values_kept_not_the_ones_trained_since(self):
        kept = last_step.LastStep(self.variables, self.strategy)
        position = training_state.Position(epoch=1, step=0, steps_done=4)
        kept.keep(position)
        expected = [np.array(v) for v in self.variables]
        _fit_one_epoch(self.model, seed=1)  # Every variable changes: a copy must not.
        self.assertNotAllClose(np.array(self.variables[0]), expected[0])

        backup = self.create_tempdir().full_path
        state = training_state.TrainingState(self.model, backup, is_writer=False)
        self.assertEqual(kept.save(state, "worker:1"), position)

        # Every local replica holds the kept values again, and so does the state written.
        for variable, value in zip(self.variables, expected):
            tf_variable = variable if isinstance(variable, tf.Variable) else variable.value
            for replica in self.strategy.experimental_local_results(tf_variable):
                self.assertAllEqual(replica, value)
        with self.strategy.scope():
            fresh = tfdist.testing.small_classifier(tf.keras.optimizers.SGD(0.1, momentum=0.9), seed=3)
        self.assertEqual(training_state.TrainingState(fresh, backup, is_writer=True).restore(), position)
        for restored, value in zip(training_state.variables(fresh), expected):
            self.assertAllEqual(np.array(restored), value)

    def test_keeping_takes_at_most_its_share_of_the_time(self):
        kept = last_step.LastStep(self.variables, self.strategy)
        first = training_state.Position(epoch=0, step=1)
        with mock.patch.object(last_step, "COST_SHARE", 1e-6):
            self.assertTrue(kept.keep(first))
            # The pause after a keep is a million times what it took.
            self.assertFalse(kept.keep(training_state.Position(epoch=0, step=2)))
        self.assertEqual(kept.position, first)
        with mock.patch.object(last_step, "COST_SHARE", 1.0):
            kept = last_step.LastStep(self.variables, self.strategy)
            for step in range(1, 4):
                self.assertTrue(kept.keep(training_state.Position(epoch=0, step=step)))

    def test_nothing_kept_saves_nothing(self):
        backup = self.create_tempdir().full_path
        state = training_state.TrainingState(self.model, backup, is_writer=False)
        self.assertIsNone(last_step.LastStep(self.variables, self.strategy).save(state, "worker:0"))
        self.assertIsNone(state.latest_directory())

    def test_one_process_strategies_keep_nothing(self):
        # No peer to lose: the state is not copied at each step.
        self.assertIsNone(last_step.LastStep.for_state(self.variables, self.strategy))
        self.assertFalse(last_step.replicates_state_over_tasks(tf.distribute.get_strategy()))


if __name__ == "__main__":
    tf.test.main()
