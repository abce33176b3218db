"""The Keras internals the parameter-server strategy relies on (tfdist/_internal/keras_ps.py).

These fail when Keras (3 or tf-keras) changes what tfdist depends on:
where its loops call `experimental_distribute_dataset` from, how they
call the step functions and read metrics, and what `assign_add` of a
Keras 3 variable does. They run on one device (no cluster).
"""

from __future__ import annotations


import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist._internal import keras_ps
from tests.front_end import KERAS_3

pytestmark = pytest.mark.model

keras = tf.keras


class RecordingStrategy(tf.distribute.OneDeviceStrategy):
    """Records which Keras call distributes each dataset."""

    def __init__(self):
        super().__init__("/cpu:0")
        self.calls: list[keras_ps.KerasCall | None] = []
        self.batches: list[int | None] = []

    def experimental_distribute_dataset(self, dataset, options=None):
        self.calls.append(keras_ps.calling_model())
        self.batches.append(keras_ps.data_batches())
        return super().experimental_distribute_dataset(dataset, options)


def _model(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return model


def _data():
    return np.ones((8, 3), "float32"), np.zeros((8, 2), "float32")


class CallingModelTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("fit", lambda m, x, y: m.fit(x, y, batch_size=4, verbose=0), "fit"),
        ("evaluate", lambda m, x, y: m.evaluate(x, y, batch_size=4, verbose=0), "evaluate"),
        ("predict", lambda m, x, y: m.predict(x, batch_size=4, verbose=0), "predict"),
    )
    def test_keras_loops_are_found_from_the_strategy(self, run, method):
        strategy = RecordingStrategy()
        model = _model(strategy)
        run(model, *_data())
        found = [c for c in strategy.calls if c is not None]
        self.assertNotEmpty(found)
        self.assertIs(found[0].model, model)
        self.assertEqual(found[0].method, method)
        self.assertEqual(found[0].keras3, KERAS_3)

    def test_nothing_found_outside_keras(self):
        strategy = RecordingStrategy()
        strategy.experimental_distribute_dataset(tf.data.Dataset.range(4).batch(2))
        self.assertEqual(strategy.calls, [None])
        self.assertEqual(strategy.batches, [None])


class DataBatchesTest(tf.test.TestCase):

    def test_keras_counts_the_batches_of_arrays_tf_data_cannot(self):
        strategy = RecordingStrategy()
        model = _model(strategy)
        x, y = np.ones((10, 3), "float32"), np.zeros((10, 2), "float32")
        model.fit(x, y, batch_size=4, verbose=0)
        self.assertEqual(strategy.batches, [3])  # 4 + 4 + 2 rows.

    def test_a_dataset_keras_cannot_count_gives_none(self):
        strategy = RecordingStrategy()
        model = _model(strategy)
        x, y = _data()
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(4)
        model.fit(dataset, verbose=0)
        self.assertEqual(strategy.batches, [None])


class InstallFunctionsTest(tf.test.TestCase):

    def test_fit_evaluate_predict_call_the_installed_functions(self):
        model = _model(tf.distribute.get_strategy())
        calls = {"train": 0, "test": 0, "predict": 0, "barrier": 0}

        def counted(kind):
            # Keras's own function (Keras 3's make_* returns None), counted.
            made = getattr(model, f"make_{kind}_function")()
            keras_function = made if made is not None else getattr(model, f"{kind}_function")

            def function(data):
                calls[kind] += 1
                return keras_function(data)

            return function

        keras_functions = {kind: counted(kind) for kind in ("train", "test", "predict")}
        owner = object()
        keras_ps.install_functions(
            model,
            owner,
            train=keras_functions["train"],
            test=keras_functions["test"],
            predict=keras_functions["predict"],
            metrics_barrier=lambda: calls.__setitem__("barrier", calls["barrier"] + 1),
        )
        self.assertIs(keras_ps.installed_owner(model), owner)
        x, y = _data()
        model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        model.evaluate(x, y, batch_size=4, verbose=0)
        model.predict(x, batch_size=4, verbose=0)
        self.assertEqual(calls["train"], 4)
        self.assertEqual(calls["test"], 2)
        self.assertEqual(calls["predict"], 2)
        # Once per epoch and per evaluate, never from inside a traced step.
        self.assertGreaterEqual(calls["barrier"], 3)

    def test_steps_per_execution_is_the_count_of_the_call_being_made(self):
        # tf-keras lowers its variable for a last, partial group of steps;
        # tfdist takes the count from the calling loop's DataHandler.
        model = _model(tf.distribute.get_strategy())
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
        counts = []
        make = model.make_train_function()
        keras_train = make if make is not None else model.train_function

        def train(data):
            counts.append(keras_ps.steps_per_execution(model))
            return keras_train(data)

        keras_ps.install_functions(
            model, object(), train=train, test=None, predict=None, metrics_barrier=lambda: None
        )
        x, y = np.ones((16, 3), "float32"), np.zeros((16, 2), "float32")
        model.fit(x, y, batch_size=2, verbose=0)  # 8 batches.
        self.assertEqual(counts, [3, 3, 3] if KERAS_3 else [3, 3, 2])

    def test_other_instances_keep_keras_functions(self):
        model, other = _model(tf.distribute.get_strategy()), _model(tf.distribute.get_strategy())
        keras_ps.install_functions(
            model, object(), train=None, test=None, predict=None, metrics_barrier=lambda: None
        )
        self.assertNotIn("make_train_function", vars(other))


@pytest.mark.skipif(not KERAS_3, reason="Keras 3's KerasVariable only")
class ExactCountersTest(tf.test.TestCase):

    def test_keras_assign_add_is_a_read_then_a_write(self):
        # What tfdist fixes: if Keras makes assign_add atomic, this fails
        # and the fix can go.
        variable = keras.Variable(0.0)
        graph = tf.function(lambda: variable.assign_add(1.0)).get_concrete_function().graph
        types = {op.type for op in graph.get_operations()}
        self.assertIn("AssignVariableOp", types)
        self.assertNotIn("AssignAddVariableOp", types)

    def test_exact_counters_are_one_atomic_op_on_those_variables_only(self):
        variable, other = keras.Variable(0.0), keras.Variable(0.0)
        self.assertEqual(keras_ps.make_counters_exact([variable]), 1)
        self.assertEqual(keras_ps.make_counters_exact([variable]), 0)  # Idempotent.
        add = tf.function(lambda: variable.assign_add(2.0)).get_concrete_function().graph
        sub = tf.function(lambda: variable.assign_sub(1.0)).get_concrete_function().graph
        self.assertIn("AssignAddVariableOp", {op.type for op in add.get_operations()})
        self.assertIn("AssignSubVariableOp", {op.type for op in sub.get_operations()})
        variable.assign_add(2.0)
        variable.assign_sub(0.5)
        self.assertEqual(float(variable.numpy()), 1.5)
        self.assertNotIn("assign_add", vars(other))

    def test_variables_created_under_a_creator_that_asks_are_exact(self):
        def creator(next_creator, **kwargs):
            variable = next_creator(**kwargs)
            found.append(keras_ps.make_counter_exact(keras_ps.creating_keras3_variable()))
            return variable

        found = []
        with tf.variable_creator_scope(creator):
            variable = keras.Variable(0.0)
        other = keras.Variable(0.0)
        self.assertEqual(found, [True])
        add = tf.function(lambda: variable.assign_add(2.0)).get_concrete_function().graph
        self.assertIn("AssignAddVariableOp", {op.type for op in add.get_operations()})
        variable.assign_add(2.0)
        self.assertEqual(float(variable.numpy()), 2.0)
        self.assertNotIn("assign_add", vars(other))

    def test_outside_keras_variable_creation_finds_none(self):
        self.assertIsNone(keras_ps.creating_keras3_variable())
        self.assertFalse(keras_ps.make_counter_exact(None))

    def test_exact_counter_broadcasts_like_keras(self):
        variable = keras.Variable(np.zeros((2, 2), "float32"))
        keras_ps.make_counters_exact([variable])
        variable.assign_add(1.0)
        self.assertAllEqual(variable.numpy(), np.ones((2, 2)))


if __name__ == "__main__":
    tfdist.testing.main()
