"""tfdist.elastic.Elastic in one process: a fit stopped at a step and resumed equals one uninterrupted fit.

Each case trains the elastic tests' counting classifier
(tests/integration/elastic_script.py: 120 examples, 8 steps an epoch with a
short last one, SGD with momentum) for 3 epochs without a callback, then
again with `Elastic` and a preemption notice after step SIGNAL_STEP + 1 of
epoch SIGNAL_EPOCH: `fit` raises `TrainingPreempted` (exit status 143) at a
step of that epoch. A new model resumes from the backup. The resumed model
equals the uninterrupted one (same arithmetic: bit for bit), and the
examples it counted (a weight, restored with the others) were each trained
on once per epoch.

Strategies that run in one process: MirroredStrategy (plain input, and
tfdist's own per-epoch shuffle), LayerPlacementStrategy and (Keras 3)
MeshStrategy. Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1, tf-keras.
Across processes and workers: tests/integration/elastic_test.py.
"""

from __future__ import annotations

import functools
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.front_end import KERAS_3
from tests.integration import elastic_script as job

pytestmark = pytest.mark.model
keras = tf.keras


def _strategy(name, shard):
    options = tfdist.data.ShardOptions(seed=7, shuffle=True) if shard else None
    if name == "mirrored":
        return tfdist.MirroredStrategy(["/cpu:0", "/cpu:1"], shard_options=options)
    if name == "layer_placement":
        return tfdist.LayerPlacementStrategy(devices=["/cpu:0", "/cpu:1"])
    return tfdist.MeshStrategy({"batch": 2, "model": 2})


class _NoticeAt(keras.callbacks.Callback):
    """A preemption notice after `batch` of `epoch`: SIGTERM, or `request_preemption`."""

    def __init__(self, elastic, sigterm, batch=job.SIGNAL_STEP, epoch=job.SIGNAL_EPOCH):
        super().__init__()
        self._elastic, self._sigterm, self._batch, self._at = elastic, sigterm, batch, epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self._epoch, batch) == (self._at, self._batch):
            if self._sigterm:
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                self._elastic.request_preemption()


def _fit(strategy, callbacks=(), adam_and_dropout=False):
    with strategy.scope():
        # tf-keras's Dropout draws from random ops' own state, which is no
        # variable: a resumed run draws other masks (docs/elastic.md).
        model = job.build_model(adam=adam_and_dropout, dropout=adam_and_dropout and KERAS_3)
    x, y = job.data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(job.GLOBAL_BATCH_SIZE)
    try:
        model.fit(dataset, epochs=job.EPOCHS, verbose=0, callbacks=list(callbacks))
        preempted = None
    except tfdist.errors.TrainingPreempted as e:
        preempted = e
    return model, preempted


@functools.cache
def _uninterrupted_weights(strategy, shard, adam_and_dropout):
    """The weights and step count of the fit without a callback (computed once per file)."""
    model, _ = _fit(_strategy(strategy, shard), adam_and_dropout=adam_and_dropout)
    return model.get_weights(), int(model.optimizer.iterations.numpy())


class ElasticFitTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        dict(testcase_name="mirrored", strategy="mirrored", shard=False, sigterm=False),
        dict(testcase_name="mirrored_adam_dropout", strategy="mirrored", shard=False, sigterm=False,
             adam_and_dropout=True),
        dict(testcase_name="mirrored_sigterm", strategy="mirrored", shard=False, sigterm=True),
        dict(testcase_name="mirrored_tfdist_shuffle", strategy="mirrored", shard=True, sigterm=False),
        dict(testcase_name="layer_placement", strategy="layer_placement", shard=False, sigterm=False),
        dict(testcase_name="mesh", strategy="mesh", shard=False, sigterm=False),
    )
    def test_stopped_and_resumed_equals_uninterrupted(
        self, strategy, shard, sigterm, adam_and_dropout=False
    ):
        if strategy == "mesh" and not KERAS_3:
            self.skipTest("MeshStrategy trains Keras 3 models only (DTensor layouts of Keras 3's DeviceMesh).")
        reference, iterations = _uninterrupted_weights(strategy, shard, adam_and_dropout)
        backup = os.path.join(self.create_tempdir().full_path, "backup")

        elastic = tfdist.elastic.Elastic(backup, save_freq=None)
        stopped, preempted = _fit(
            _strategy(strategy, shard), [elastic, _NoticeAt(elastic, sigterm)], adam_and_dropout
        )
        self.assertIsNotNone(preempted, "fit ran to its end despite the notice")
        self.assertEqual(preempted.code, tfdist.errors.PREEMPTED_EXIT_CODE)
        # The first step end after the notice, not the epoch's end.
        self.assertEqual((preempted.epoch, preempted.step), (job.SIGNAL_EPOCH, job.SIGNAL_STEP + 2))
        self.assertTrue(os.path.isdir(backup))

        resumed, preempted_again = _fit(
            _strategy(strategy, shard), [tfdist.elastic.Elastic(backup)], adam_and_dropout
        )
        self.assertIsNone(preempted_again)
        for a, b in zip(reference, resumed.get_weights()):
            self.assertAllEqual(a, b)
        self.assertEqual(int(resumed.optimizer.iterations.numpy()), iterations)
        # The counts are a weight, restored: the resumed model's cover both fits.
        self.assertAllEqual(resumed.layers[0].counts.numpy(), np.full(job.NUM_EXAMPLES, job.EPOCHS))
        self.assertLess(np.sum(stopped.layers[0].counts.numpy()), job.EPOCHS * job.NUM_EXAMPLES)
        self.assertFalse(os.path.exists(backup))  # Deleted once the fit completed.


class ElasticEpochEndTest(tf.test.TestCase):
    def test_a_stop_on_an_epochs_last_step_saves_at_the_epoch_end_and_resumes_the_next_epoch(self):
        # tfdist's per-epoch shuffle: the resumed job must draw the next
        # epoch's order, not the first epoch's again.
        reference, _ = _uninterrupted_weights("mirrored", True, False)
        backup = os.path.join(self.create_tempdir().full_path, "backup")
        elastic = tfdist.elastic.Elastic(backup, save_freq=None)
        notice = _NoticeAt(elastic, False, batch=job.STEPS_PER_EPOCH - 2)
        stopped, preempted = _fit(_strategy("mirrored", True), [elastic, notice])
        self.assertEqual((preempted.epoch, preempted.step), (job.SIGNAL_EPOCH + 1, 0))
        resumed, _ = _fit(_strategy("mirrored", True), [tfdist.elastic.Elastic(backup)])
        for a, b in zip(reference, resumed.get_weights()):
            self.assertAllEqual(a, b)
        self.assertAllEqual(resumed.layers[0].counts.numpy(), np.full(job.NUM_EXAMPLES, job.EPOCHS))


def _fit_endless(callbacks=()):
    """TF's multi-worker tutorial's input: one `shuffle().repeat()` stream read across epochs.

    Not reshuffled per repetition: under Keras 3 the batch read to build a
    model can draw a reshuffle's seed first (tests/conformance/
    multi_worker_keras_tutorial_test.py). The stream still matters: 120
    examples in batches of 16 straddle its repetitions.
    """
    with _strategy("mirrored", False).scope():
        model = job.build_model()
    x, y = job.data()
    dataset = (tf.data.Dataset.from_tensor_slices((x, y))
               .shuffle(job.NUM_EXAMPLES, seed=3, reshuffle_each_iteration=False)
               .repeat().batch(job.GLOBAL_BATCH_SIZE))
    try:
        model.fit(dataset, epochs=job.EPOCHS, steps_per_epoch=job.STEPS_PER_EPOCH - 1, verbose=0,
                  callbacks=list(callbacks))
    except tfdist.errors.TrainingPreempted:
        return model, True
    return model, False


class ElasticEndlessInputTest(tf.test.TestCase):
    def test_a_repeated_stream_under_steps_per_epoch_resumes_after_every_step_trained(self):
        reference, _ = _fit_endless()
        backup = os.path.join(self.create_tempdir().full_path, "backup")
        elastic = tfdist.elastic.Elastic(backup, save_freq=None)
        _, preempted = _fit_endless([elastic, _NoticeAt(elastic, False)])
        self.assertTrue(preempted)
        resumed, preempted_again = _fit_endless([tfdist.elastic.Elastic(backup)])
        self.assertFalse(preempted_again)
        for a, b in zip(reference.get_weights(), resumed.get_weights()):
            self.assertAllEqual(a, b)


class ElasticLastEpochTest(tf.test.TestCase):
    def test_a_stop_at_the_last_epochs_end_lets_fit_complete(self):
        backup = os.path.join(self.create_tempdir().full_path, "backup")
        elastic = tfdist.elastic.Elastic(backup, save_freq=None)
        notice = _NoticeAt(elastic, False, batch=job.STEPS_PER_EPOCH - 2, epoch=job.EPOCHS - 1)
        _, preempted = _fit(_strategy("mirrored", False), [elastic, notice])
        self.assertIsNone(preempted)  # Training was complete: nothing to resume.
        self.assertFalse(os.path.exists(backup))


class ElasticAfterAFailedFitTest(tf.test.TestCase):
    def test_after_fit_raised_sigterm_reaches_the_handler_that_was_there_before(self):
        # Keras ends no callback when fit raises; a SIGTERM then (a launcher
        # stopping the task) must not be swallowed as a notice.
        seen = []
        previous = signal.signal(signal.SIGTERM, lambda number, frame: seen.append(number))
        self.addCleanup(signal.signal, signal.SIGTERM, previous)

        class Fail(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:
                    raise RuntimeError("a step failed")

        elastic = tfdist.elastic.Elastic(os.path.join(self.create_tempdir().full_path, "b"))
        with self.assertRaisesRegex(RuntimeError, "a step failed"):
            _fit(_strategy("mirrored", False), [elastic, Fail()])
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertEqual(seen, [signal.SIGTERM])
        self.assertFalse(elastic.preemption_requested)


class ElasticAfterAFailedResumeTest(tf.test.TestCase):
    def test_a_resumed_fit_that_raised_leaves_the_next_fit_starting_where_it_is_told(self):
        backup = os.path.join(self.create_tempdir().full_path, "backup")
        elastic = tfdist.elastic.Elastic(backup, save_freq=None)
        _, preempted = _fit(_strategy("mirrored", False), [elastic, _NoticeAt(elastic, False)])
        self.assertIsNotNone(preempted)

        class Fail(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                raise RuntimeError("the resumed fit failed")

        strategy = _strategy("mirrored", False)
        with strategy.scope():
            model = job.build_model()
        x, y = job.data()
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(job.GLOBAL_BATCH_SIZE)
        with self.assertRaisesRegex(RuntimeError, "the resumed fit failed"):
            model.fit(dataset, epochs=job.EPOCHS, verbose=0,
                      callbacks=[tfdist.elastic.Elastic(backup), Fail()])
        # A new backup: nothing to resume, so every epoch from 0 trains, in full.
        fresh = tfdist.elastic.Elastic(os.path.join(self.create_tempdir().full_path, "other"))
        steps = []

        class Count(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                steps.append(batch)

        history = model.fit(dataset, epochs=job.EPOCHS, verbose=0, callbacks=[fresh, Count()])
        self.assertEqual(history.epoch, list(range(job.EPOCHS)))
        self.assertLen(steps, job.EPOCHS * job.STEPS_PER_EPOCH)


class ElasticArgumentsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        dict(testcase_name="save_freq_zero", kwargs={"save_freq": 0}, pattern="save_freq=0"),
        dict(testcase_name="save_freq_word", kwargs={"save_freq": "batch"}, pattern="save_freq='batch'"),
        dict(testcase_name="empty_backup_dir", kwargs={"backup_dir": ""}, pattern="backup_dir=''"),
    )
    def test_bad_arguments_raise_config_error_naming_them(self, kwargs, pattern):
        kwargs = {"backup_dir": "/tmp/backup", **kwargs}
        with self.assertRaisesRegex(tfdist.errors.ConfigError, pattern):
            tfdist.elastic.Elastic(**kwargs)

    # What the callback reads of a model: its strategy, built without a cluster.
    @parameterized.named_parameters(
        ("tf_strategy", tf.distribute.ParameterServerStrategy, None,
         r"tfdist's parameter-server strategy, not TF's.*ParameterServerStrategyV2.*BackupAndRestore"),
        ("input_service", tfdist.ParameterServerStrategy, "chief",
         r"tf.data service \(input_service='chief'\).*input_service=None"),
    )
    def test_a_parameter_server_strategy_elastic_cannot_resume_is_refused_at_fit_start(
            self, strategy_class, input_service, pattern):
        strategy = object.__new__(strategy_class)
        strategy._input_service_target = input_service

        class Model:
            distribute_strategy = strategy

        elastic = tfdist.elastic.Elastic("/tmp/backup")
        elastic.set_model(Model())
        with self.assertRaisesRegex(tfdist.errors.ConfigError, pattern):
            elastic.on_train_begin()

    def test_resuming_mid_epoch_under_a_strategy_without_tfdist_input_raises_config_error(self):
        backup = os.path.join(self.create_tempdir().full_path, "backup")
        elastic = tfdist.elastic.Elastic(backup, save_freq=None)
        _, preempted = _fit(_strategy("mirrored", False), [elastic, _NoticeAt(elastic, False)])
        self.assertIsNotNone(preempted)
        with self.assertRaisesRegex(
            tfdist.errors.ConfigError, r"did not start there.*MirroredStrategy.*tfdist strategy"
        ):
            _fit(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), [tfdist.elastic.Elastic(backup)])


if __name__ == "__main__":
    tfdist.testing.main()
