"""Elastic's survivor save: once per fit, and its error hook leaves with the fit it ends."""

from __future__ import annotations

from unittest import mock

import pytest
import tensorflow as tf

import tfdist
from tfdist import errors
from tfdist._internal import tf_errors
from tfdist.elastic import last_step

pytestmark = [pytest.mark.model]


class SurvivorSaveTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.callback = tfdist.elastic.Elastic(self.create_tempdir().full_path)
        model = mock.Mock()
        model.distribute_strategy.cluster_config.task.name = "worker:0"
        self.callback.set_model(model)
        with mock.patch.object(last_step, "replicates_state_over_tasks", return_value=True):
            self.callback._keep_last_step(model.distribute_strategy)
        self.addCleanup(self.callback._stop_keeping)
        # What `_keep` and `on_train_begin` hold once a step was kept.
        self.kept = mock.Mock(spec=last_step.LastStep)
        self.callback._last_step = self.kept
        self.callback._state = mock.Mock()

    def _hooked(self):
        return self.callback._on_function_error in tf_errors._function_error_callbacks

    def test_a_lost_peer_saves_once_and_takes_the_hook_away(self):
        self.assertTrue(self._hooked())
        lost = errors.WorkerUnavailableError("peer lost", task="worker:1")
        self.callback._on_function_error(lost)
        self.kept.save.assert_called_once_with(self.callback._state, "worker:0")
        # The error ends the fit: nothing of tfdist's stays in TF's error path for it.
        self.assertFalse(self._hooked())
        self.callback._on_function_error(lost)
        self.kept.save.assert_called_once()

    def test_other_errors_save_nothing_and_keep_the_hook(self):
        self.callback._on_function_error(tf.errors.InvalidArgumentError(None, None, "bad input"))
        self.kept.save.assert_not_called()
        self.assertTrue(self._hooked())


if __name__ == "__main__":
    tfdist.testing.main()
