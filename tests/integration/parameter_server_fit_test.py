"""tfdist.ParameterServerStrategy through Keras's fit, evaluate and predict.

One child process (tfdist.testing.run_local_cluster with one task) starts
an in-process cluster of 2 workers and 2 ps (`start_local_ps_cluster`),
builds the strategy as the chief, runs every scenario below and returns
what it saw; the tests check it. Runs under Keras 3 and, with
TF_USE_LEGACY_KERAS=1, tf-keras (the child inherits the environment).

Input is counted exactly (`ps_counting`).
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.integration import ps_counting

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

CLUSTER_TIMEOUT_S = 420
STRATEGY_TIMEOUT_S = 120
CUSTOM_LOOP_STEPS = 60


def fit_scenarios() -> dict[str, object]:
    """Runs in the child: every scenario on one in-process cluster."""
    keras = tf.keras
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    strategy = tfdist.ParameterServerStrategy(config, timeout_s=STRATEGY_TIMEOUT_S)
    x, y = ps_counting.data()
    record: dict[str, object] = {}

    def finite_dataset():
        model, counter = ps_counting.build(keras, strategy)

        class Batches(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.batch_ends, self.epoch_logs, self.counts = 0, [], []

            def on_train_batch_end(self, batch, logs=None):
                self.batch_ends += 1

            def on_epoch_end(self, epoch, logs=None):
                self.epoch_logs.append(dict(logs))
                self.counts.append(counter.counts.numpy().copy())

        # An unseeded shuffle: on several workers' own copies this would
        # lose and repeat examples; the chief reads the one pipeline.
        dataset = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(ps_counting.NUM_EXAMPLES)
            .batch(ps_counting.BATCH_SIZE)
        )
        callback = Batches()
        history = model.fit(dataset, epochs=2, callbacks=[callback], verbose=0)
        reference, _ = ps_counting.build(keras, tf.distribute.get_strategy())
        reference.set_weights(model.get_weights())
        return {
            "iterations": int(model.optimizer.iterations.numpy()),
            "batch_ends": callback.batch_ends,
            "epoch_logs": callback.epoch_logs,
            "history": history.history,
            "counts_per_epoch": [callback.counts[0], callback.counts[1] - callback.counts[0]],
            "evaluate": model.evaluate(x, y, batch_size=ps_counting.BATCH_SIZE, verbose=0),
            "evaluate_one_device": reference.evaluate(x, y, batch_size=ps_counting.BATCH_SIZE, verbose=0),
            "predict": model.predict(x, batch_size=ps_counting.BATCH_SIZE, verbose=0),
            "predict_one_device": reference.predict(x, batch_size=ps_counting.BATCH_SIZE, verbose=0),
            "executions_by_worker": dict(strategy.executions_by_worker),
        }

    def steps_per_execution():
        model, counter = ps_counting.build(keras, strategy, steps_per_execution=3)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(ps_counting.BATCH_SIZE)
        history = model.fit(dataset, epochs=2, verbose=0)
        return {
            "iterations": int(model.optimizer.iterations.numpy()),
            "counts": counter.counts.numpy(),
            "examples": history.history["examples"],
            "predict_rows": model.predict(x, batch_size=ps_counting.BATCH_SIZE, verbose=0).shape[0],
        }

    def repeat_and_steps_per_epoch():
        model, counter = ps_counting.build(keras, strategy)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(ps_counting.BATCH_SIZE)
        model.fit(dataset, epochs=3, steps_per_epoch=4, verbose=0)
        return {
            "iterations": int(model.optimizer.iterations.numpy()),
            "trained": int(counter.counts.numpy().sum()),
        }

    def dataset_creator():
        # TF's parameter-server tutorial: fit(DatasetCreator(dataset_fn),
        # steps_per_epoch=...). tf-keras only (Keras 3 has no DatasetCreator).
        if ps_counting.KERAS_3:
            return {"skipped": True}
        model, counter = ps_counting.build(keras, strategy, steps_per_execution=2)

        def dataset_fn(input_context):
            return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(ps_counting.BATCH_SIZE)

        creator = keras.utils.experimental.DatasetCreator(dataset_fn)
        model.fit(creator, epochs=2, steps_per_epoch=4, verbose=0)
        return {
            "iterations": int(model.optimizer.iterations.numpy()),
            "trained": int(counter.counts.numpy().sum()),
        }

    def checkpoint_callbacks():
        model, _ = ps_counting.build(keras, strategy)
        directory = tempfile.mkdtemp(prefix="tfdist-ps-fit-")
        backup = os.path.join(directory, "backup")
        checkpoint = os.path.join(
            directory,
            "model-{epoch}.weights.h5" if ps_counting.KERAS_3 else "model-{epoch}.ckpt",
        )

        class StopAtEpoch(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == 2:
                    raise RuntimeError("interrupted")

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(ps_counting.BATCH_SIZE)
        first = [
            keras.callbacks.BackupAndRestore(backup),
            keras.callbacks.ModelCheckpoint(checkpoint, save_weights_only=True),
            keras.callbacks.TensorBoard(os.path.join(directory, "logs")),
            StopAtEpoch(),
        ]
        try:
            model.fit(dataset, epochs=4, callbacks=first, verbose=0)
        except RuntimeError:
            pass
        iterations_at_interrupt = int(model.optimizer.iterations.numpy())
        resumed, _ = ps_counting.build(keras, strategy)
        history = resumed.fit(
            dataset, epochs=4, callbacks=[keras.callbacks.BackupAndRestore(backup)], verbose=0
        )
        return {
            "iterations_at_interrupt": iterations_at_interrupt,
            "resumed_epochs": len(history.history["loss"]),
            "resumed_iterations": int(resumed.optimizer.iterations.numpy()),
            "files": sorted(os.listdir(directory)),
            "tensorboard": sorted(os.listdir(os.path.join(directory, "logs"))),
        }

    def train_on_batch():
        model, _ = ps_counting.build(keras, strategy)
        logs = [
            model.train_on_batch(x[:ps_counting.BATCH_SIZE], y[:ps_counting.BATCH_SIZE], return_dict=True)
            for _ in range(3)
        ]
        return {"iterations": int(model.optimizer.iterations.numpy()), "logs": logs}

    def many_small_steps():
        model, _ = ps_counting.build(keras, strategy)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
        model.fit(dataset, epochs=1, verbose=0)
        return {
            "iterations": int(model.optimizer.iterations.numpy()),
            "examples": float(model.evaluate(x, y, batch_size=2, verbose=0)[-1]),
        }

    def custom_loop():
        # TF's parameter-server tutorial's custom training loop: a
        # ClusterCoordinator of the user's own, per-worker datasets, steps
        # scheduled on both workers at once.
        with strategy.scope():
            model = keras.Sequential([keras.Input((ps_counting.NUM_FEATURES,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.SGD(0.01)
            loss_metric = keras.metrics.Mean()
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)

        def dataset_fn(_):
            return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(2)

        @tf.function
        def per_worker_dataset_fn():
            return strategy.distribute_datasets_from_function(dataset_fn)

        iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

        @tf.function
        def step_fn(iterator):
            def replica_fn(features, labels):
                with tf.GradientTape() as tape:
                    pred = model(features, training=True)
                    loss = tf.reduce_mean((pred[:, 0] - tf.cast(labels, tf.float32)) ** 2)
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                loss_metric.update_state(loss)
                return loss

            features, labels = next(iterator)
            return strategy.run(replica_fn, args=(features, labels))

        for _ in range(CUSTOM_LOOP_STEPS):
            coordinator.schedule(step_fn, args=(iterator,))
        coordinator.join()
        return {
            "same_coordinator": coordinator is strategy.coordinator,
            "iterations": int(optimizer.iterations.numpy()),
            "metric_count": float(loss_metric.count.numpy()),
        }

    ps_counting.run_scenario(record, "finite_dataset", finite_dataset)
    ps_counting.run_scenario(record, "custom_loop", custom_loop)
    ps_counting.run_scenario(record, "many_small_steps", many_small_steps)
    ps_counting.run_scenario(record, "steps_per_execution", steps_per_execution)
    ps_counting.run_scenario(record, "repeat_and_steps_per_epoch", repeat_and_steps_per_epoch)
    ps_counting.run_scenario(record, "dataset_creator", dataset_creator)
    ps_counting.run_scenario(record, "checkpoint_callbacks", checkpoint_callbacks)
    ps_counting.run_scenario(record, "train_on_batch", train_on_batch)
    record["steps_rerun"] = strategy.steps_rerun
    return record


class ParameterServerFitTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.record,) = tfdist.testing.run_local_cluster(
            fit_scenarios, num_workers=1, timeout_s=CLUSTER_TIMEOUT_S
        )

    def scenario(self, name):
        result = self.record[name]
        self.assertNotIn("error", result, result.get("error"))
        return result

    def test_finite_dataset_trains_each_batch_once_per_epoch(self):
        result = self.scenario("finite_dataset")
        self.assertEqual(result["iterations"], 2 * ps_counting.NUM_BATCHES)
        self.assertEqual(result["batch_ends"], 2 * ps_counting.NUM_BATCHES)
        for counts in result["counts_per_epoch"]:
            np.testing.assert_array_equal(counts, np.ones(ps_counting.NUM_EXAMPLES, np.int32))

    def test_steps_run_on_every_worker(self):
        by_worker = self.scenario("finite_dataset")["executions_by_worker"]
        self.assertEqual(sorted(by_worker), [0, 1])
        self.assertTrue(all(count > 0 for count in by_worker.values()), by_worker)

    def test_epoch_metrics_count_every_worker(self):
        result = self.scenario("finite_dataset")
        self.assertEqual(result["history"]["examples"], [ps_counting.NUM_EXAMPLES] * 2)
        for logs in result["epoch_logs"]:
            self.assertEqual(logs["examples"], ps_counting.NUM_EXAMPLES)

    def test_counters_updated_by_both_workers_at_once_are_exact(self):
        # Keras 3's assign_add is read-modify-write: without tfdist's fix,
        # concurrent steps lose counts (the note's 150 steps counted as 126).
        result = self.scenario("many_small_steps")
        self.assertEqual(result["iterations"], ps_counting.NUM_EXAMPLES // 2)
        self.assertEqual(result["examples"], ps_counting.NUM_EXAMPLES)

    def test_custom_loop_on_the_coordinator_counts_every_step(self):
        # Keras 3 counters in a custom loop: without tfdist's creation-time
        # fix, 60 steps on 2 workers were counted as 40.
        result = self.scenario("custom_loop")
        self.assertTrue(result["same_coordinator"])
        self.assertEqual(result["iterations"], CUSTOM_LOOP_STEPS)
        self.assertEqual(result["metric_count"], CUSTOM_LOOP_STEPS)

    def test_evaluate_matches_one_device(self):
        result = self.scenario("finite_dataset")
        distributed = dict(zip(["loss", "accuracy", "examples"], result["evaluate"]))
        one_device = dict(zip(["loss", "accuracy", "examples"], result["evaluate_one_device"]))
        self.assertAllClose(distributed["loss"], one_device["loss"], rtol=1e-5)
        self.assertAllClose(distributed["accuracy"], one_device["accuracy"], rtol=1e-6)
        self.assertEqual(distributed["examples"], ps_counting.NUM_EXAMPLES)

    def test_predict_returns_rows_in_order(self):
        result = self.scenario("finite_dataset")
        self.assertAllClose(result["predict"], result["predict_one_device"], rtol=1e-5, atol=1e-6)

    def test_steps_per_execution_with_a_partial_last_group(self):
        result = self.scenario("steps_per_execution")
        self.assertEqual(result["iterations"], 2 * ps_counting.NUM_BATCHES)  # 7 = 3 + 3 + 1
        np.testing.assert_array_equal(result["counts"], np.full(ps_counting.NUM_EXAMPLES, 2, np.int32))
        self.assertEqual(result["examples"], [ps_counting.NUM_EXAMPLES] * 2)
        self.assertEqual(result["predict_rows"], ps_counting.NUM_EXAMPLES)

    def test_repeat_and_steps_per_epoch_as_in_tf_tutorials(self):
        result = self.scenario("repeat_and_steps_per_epoch")
        self.assertEqual(result["iterations"], 12)
        self.assertEqual(result["trained"], 12 * ps_counting.BATCH_SIZE)

    @pytest.mark.skipif(ps_counting.KERAS_3, reason="DatasetCreator is tf-keras only")
    def test_dataset_creator_and_steps_per_epoch_as_in_tf_tutorial(self):
        result = self.scenario("dataset_creator")
        self.assertEqual(result["iterations"], 8)
        self.assertEqual(result["trained"], 8 * ps_counting.BATCH_SIZE)

    def test_backup_and_restore_resumes_after_an_interruption(self):
        result = self.scenario("checkpoint_callbacks")
        self.assertEqual(result["iterations_at_interrupt"], 2 * ps_counting.NUM_BATCHES)
        self.assertEqual(result["resumed_epochs"], 2)
        self.assertEqual(result["resumed_iterations"], 4 * ps_counting.NUM_BATCHES)

    def test_model_checkpoint_and_tensorboard_write(self):
        result = self.scenario("checkpoint_callbacks")
        self.assertTrue(any(f.startswith("model-1") for f in result["files"]), result["files"])
        self.assertIn("train", result["tensorboard"])

    def test_train_on_batch_returns_that_batch_logs(self):
        result = self.scenario("train_on_batch")
        self.assertEqual(result["iterations"], 3)
        self.assertEqual([logs["examples"] for logs in result["logs"]], [ps_counting.BATCH_SIZE] * 3)

    def test_no_step_was_rerun(self):
        self.assertEqual(self.record["steps_rerun"], 0)


if __name__ == "__main__":
    tfdist.testing.main()
