"""tfdist.ParameterServerStrategy(input_service=...): workers read their batches from a tf.data service.

Each test class runs one child process (tfdist.testing.run_local_cluster
with one task): it starts an in-process cluster of 2 workers and 2 ps,
builds the strategy as the chief with its `input_service`, runs the
scenarios and returns what it saw. Input is counted exactly
(`ps_counting`). Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1,
tf-keras.

Without faults every example is trained on once per epoch. That needs
the epoch barrier to settle the passes (`ReadingSteps.settle`): without
it, batches the workers' readers had fetched ahead went untrained (8 and
72 of 200 examples in a 2-epoch fit of `finite_dataset`'s pipeline), and
`validation_steps=2` evaluated one batch (a read came back empty while
the other reader held the rest).
"""

from __future__ import annotations


import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.integration import ps_counting
from tfdist import errors

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

CLUSTER_TIMEOUT_S = 300
STRATEGY_TIMEOUT_S = 120


def _fit_counting(
    keras, strategy, dataset, *, epochs, steps_per_execution=1, callbacks=(), **fit_kwargs
):
    """Fits the counting model; per-epoch counts of each example id, and what Keras saw."""
    model, counter = ps_counting.build(keras, strategy, steps_per_execution=steps_per_execution)
    counts, batch_ends = [], []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batch_ends.append(batch)

        def on_epoch_end(self, epoch, logs=None):
            counts.append(counter.counts.numpy().copy())

    history = model.fit(
        dataset, epochs=epochs, callbacks=[Record(), *callbacks], verbose=0, **fit_kwargs
    )
    per_epoch = [counts[0]] + [b - a for a, b in zip(counts, counts[1:])]
    return model, {
        "iterations": int(model.optimizer.iterations.numpy()),
        "batch_ends": len(batch_ends),
        "counts_per_epoch": per_epoch,
        "history": history.history,
    }


def service_on_chief() -> dict[str, object]:
    """Runs in the child: input_service="chief" (a dispatcher and tf.data worker in the chief)."""
    keras = tf.keras
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    strategy = tfdist.ParameterServerStrategy(
        config, timeout_s=STRATEGY_TIMEOUT_S, input_service="chief"
    )
    x, y = ps_counting.data()
    batch_size = ps_counting.BATCH_SIZE
    record: dict[str, object] = {}
    in_order = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)

    def finite_dataset():
        # An unseeded shuffle: the service runs the one pipeline.
        dataset = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(ps_counting.NUM_EXAMPLES)
            .batch(batch_size)
        )
        model, seen = _fit_counting(keras, strategy, dataset, epochs=2, validation_data=in_order)
        reference, _ = ps_counting.build(keras, tf.distribute.get_strategy())
        reference.set_weights(model.get_weights())
        seen.update(
            evaluate=model.evaluate(in_order, verbose=0),
            evaluate_one_device=reference.evaluate(in_order, verbose=0),
            predict=model.predict(x, batch_size=batch_size, verbose=0),
            predict_one_device=reference.predict(x, batch_size=batch_size, verbose=0),
            executions_by_worker=strategy.executions_by_worker,
        )
        return seen

    def arrays():
        # Keras makes these a dataset tf.data cannot count (unknown
        # cardinality); Keras's data adapter knows its batches.
        _, seen = _fit_counting(
            keras, strategy, x, epochs=2, y=y, batch_size=batch_size, validation_data=(x, y)
        )
        return seen

    def steps_per_execution():
        _, seen = _fit_counting(keras, strategy, in_order, epochs=2, steps_per_execution=3)
        return seen

    def repeat_and_steps_per_epoch():
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch_size)
        _, seen = _fit_counting(keras, strategy, dataset, epochs=3, steps_per_epoch=4)
        return seen

    def steps_per_epoch_below_cardinality():
        # Keras keeps the pass across epochs (as on one device, epoch 2
        # goes on where epoch 1 stopped): 6 of the 7 batches, none twice.
        _, seen = _fit_counting(keras, strategy, in_order, epochs=2, steps_per_epoch=3)
        return seen

    def stopped_mid_epoch():
        class StopAtBatch2(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 2:
                    self.model.stop_training = True

        validation = in_order.take(4)  # 4 batches, 2 of them read per epoch.
        _, seen = _fit_counting(
            keras, strategy, in_order, epochs=2, callbacks=[StopAtBatch2()],
            validation_data=validation, validation_steps=2,
        )
        return seen

    def unknown_cardinality():
        dataset = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .filter(lambda features, label: features[0] >= 0)
            .batch(batch_size)
        )
        try:
            _fit_counting(keras, strategy, dataset, epochs=1)
        except errors.ConfigError as e:
            return {"raised": str(e)}
        return {"raised": None}

    ps_counting.run_scenario(record, "finite_dataset", finite_dataset)
    ps_counting.run_scenario(record, "arrays", arrays)
    ps_counting.run_scenario(record, "steps_per_execution", steps_per_execution)
    ps_counting.run_scenario(record, "repeat_and_steps_per_epoch", repeat_and_steps_per_epoch)
    ps_counting.run_scenario(record, "unknown_cardinality", unknown_cardinality)
    ps_counting.run_scenario(
        record, "steps_per_epoch_below_cardinality", steps_per_epoch_below_cardinality
    )
    ps_counting.run_scenario(record, "stopped_mid_epoch", stopped_mid_epoch)
    return record


def users_service() -> dict[str, object]:
    """Runs in the child: a dispatcher and two tf.data workers of the user's, by address."""
    keras = tf.keras
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    data_workers = [  # Kept referenced: a server stops when collected.
        service.WorkerServer(service.WorkerConfig(dispatcher_address=address, port=0))
        for _ in range(2)
    ]
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    strategy = tfdist.ParameterServerStrategy(
        config, timeout_s=STRATEGY_TIMEOUT_S, input_service=dispatcher.target
    )
    x, y = ps_counting.data()
    record: dict[str, object] = {"data_workers": len(data_workers)}

    def finite_dataset():
        dataset = (
            tf.data.Dataset.from_tensor_slices((x, y))
            .shuffle(ps_counting.NUM_EXAMPLES)
            .batch(ps_counting.BATCH_SIZE)
        )
        _, seen = _fit_counting(keras, strategy, dataset, epochs=2)
        return seen

    ps_counting.run_scenario(record, "finite_dataset", finite_dataset)
    return record


class _ServiceTest(tf.test.TestCase):
    scenarios = staticmethod(service_on_chief)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.record,) = tfdist.testing.run_local_cluster(
            cls.scenarios, num_workers=1, timeout_s=CLUSTER_TIMEOUT_S
        )

    def scenario(self, name):
        result = self.record[name]
        self.assertNotIn("error", result, result.get("error"))
        return result

    def assert_each_example_once_per_epoch(self, result, epochs):
        self.assertLen(result["counts_per_epoch"], epochs)
        for counts in result["counts_per_epoch"]:
            np.testing.assert_array_equal(counts, np.ones(ps_counting.NUM_EXAMPLES, np.int32))


class ServiceOnChiefTest(_ServiceTest):
    scenarios = staticmethod(service_on_chief)

    def test_each_example_trained_once_per_epoch(self):
        result = self.scenario("finite_dataset")
        self.assert_each_example_once_per_epoch(result, epochs=2)
        self.assertEqual(result["iterations"], 2 * ps_counting.NUM_BATCHES)
        self.assertEqual(result["batch_ends"], 2 * ps_counting.NUM_BATCHES)
        self.assertEqual(result["history"]["examples"], [ps_counting.NUM_EXAMPLES] * 2)

    def test_validation_and_evaluate_read_every_example(self):
        result = self.scenario("finite_dataset")
        self.assertEqual(result["history"]["val_examples"], [ps_counting.NUM_EXAMPLES] * 2)
        self.assertAllClose(result["evaluate"], result["evaluate_one_device"], rtol=1e-5)

    def test_predict_returns_rows_in_order(self):
        result = self.scenario("finite_dataset")
        self.assertAllClose(result["predict"], result["predict_one_device"], rtol=1e-5, atol=1e-6)

    def test_steps_run_on_every_worker(self):
        self.assertLen(self.scenario("finite_dataset")["executions_by_worker"], 2)

    def test_arrays_train_each_example_once_per_epoch(self):
        result = self.scenario("arrays")
        if ps_counting.KERAS_3:
            self.assert_each_example_once_per_epoch(result, epochs=2)
        else:
            # tf-keras makes one dataset of all epochs from arrays, one
            # service job: an epoch's readers may fetch the next epoch's
            # first batches, so only the whole fit is exact.
            np.testing.assert_array_equal(
                sum(result["counts_per_epoch"]), np.full(ps_counting.NUM_EXAMPLES, 2, np.int32)
            )
        self.assertEqual(result["iterations"], 2 * ps_counting.NUM_BATCHES)
        self.assertEqual(result["history"]["val_examples"], [ps_counting.NUM_EXAMPLES] * 2)

    def test_steps_per_execution_with_a_partial_last_group(self):
        result = self.scenario("steps_per_execution")
        self.assert_each_example_once_per_epoch(result, epochs=2)
        self.assertEqual(result["iterations"], 2 * ps_counting.NUM_BATCHES)

    def test_repeat_and_steps_per_epoch_train_exactly_those_steps(self):
        result = self.scenario("repeat_and_steps_per_epoch")
        self.assertEqual(result["iterations"], 12)
        trained = sum(int(c.sum()) for c in result["counts_per_epoch"])
        self.assertEqual(trained, 12 * ps_counting.BATCH_SIZE)

    def test_steps_per_epoch_below_cardinality_goes_on_where_the_last_epoch_stopped(self):
        result = self.scenario("steps_per_epoch_below_cardinality")
        self.assertEqual(result["iterations"], 6)
        total = sum(result["counts_per_epoch"])
        self.assertEqual(int(total.max()), 1)  # No example twice.
        # Six batches: readers fetch ahead, so the short last one may be among them.
        self.assertIn(int(total.sum()), (6 * ps_counting.BATCH_SIZE, 5 * ps_counting.BATCH_SIZE + 8))

    def test_stopping_mid_epoch_trains_no_more_batches(self):
        # The epoch barrier trains what readers fetched ahead only for a
        # pass asked for all of its batches: not the rest of a stopped one.
        result = self.scenario("stopped_mid_epoch")
        self.assertEqual(result["iterations"], 3)
        self.assertEqual(int(result["counts_per_epoch"][0].sum()), 3 * ps_counting.BATCH_SIZE)
        self.assertEqual(result["history"]["val_examples"], [2 * ps_counting.BATCH_SIZE])

    def test_unknown_cardinality_raises_config_error_with_the_fix(self):
        raised = self.scenario("unknown_cardinality")["raised"]
        self.assertIsNotNone(raised)
        self.assertIn("unknown cardinality", raised)
        self.assertIn("assert_cardinality", raised)


class UsersServiceTest(_ServiceTest):
    scenarios = staticmethod(users_service)

    def test_two_data_workers_serve_each_example_once_per_epoch(self):
        result = self.scenario("finite_dataset")
        self.assert_each_example_once_per_epoch(result, epochs=2)
        # Each data worker may end its split on a short batch: more steps
        # than the dataset's 7 batches, trained in the barrier.
        self.assertGreaterEqual(result["iterations"], 2 * ps_counting.NUM_BATCHES)


del _ServiceTest  # Not collected itself.


if __name__ == "__main__":
    tfdist.testing.main()
