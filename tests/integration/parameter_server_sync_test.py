"""mode="sync" of tfdist.ParameterServerStrategy: equal to one device with the same global batch.

One child process (an in-process cluster of 2 workers and 2 ps) trains a
model with `fit` in sync mode and the same model, from the same initial
weights, on one device with the same batches; the weights, the per-epoch
logs and `evaluate` must agree to float32 rounding. The model has an L2
penalty (added once per step, not once per slice), Adam (whose state
would drift if each slice were applied on its own) and a partial last
batch (200 examples in batches of 32: slices of 4 and 4). Runs under Keras
3 and tf-keras. The same run also trains the model of Keras's guide
"Customizing what happens in fit()", with the guide's own `train_step`
(under Keras 3 it calls `optimizer.apply`, not `apply_gradients`), whose
logged metrics must be one device's too; and a token embedding with Adam,
equal to one device under tf-keras and warned about under Keras 3.
"""

from __future__ import annotations

import traceback

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness
from tests.conformance.user_patterns import CustomModel

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

NUM_EXAMPLES = 200
BATCH_SIZE = 32
NUM_BATCHES = 7
EPOCHS = 3
CLUSTER_TIMEOUT_S = 300


def _build_custom(keras):
    # The guide's model, train_step and compile arguments, on this file's 6 features.
    inputs = keras.Input(shape=(6,))
    outputs = keras.layers.Dense(1)(inputs)
    model = CustomModel(inputs, outputs)
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def _custom_train_step_record(strategy, dataset) -> dict[str, object]:
    keras = tf.keras
    single = _build_custom(keras)
    with strategy.scope():
        model = _build_custom(keras)
    model.set_weights(single.get_weights())
    history = model.fit(dataset, epochs=1, verbose=0)
    single_history = single.fit(dataset, epochs=1, verbose=0)
    return {
        "history": history.history,
        "single_history": single_history.history,
        "weights": model.get_weights(),
        "single_weights": single.get_weights(),
        "iterations": int(model.optimizer.iterations.numpy()),
        "single_iterations": int(single.optimizer.iterations.numpy()),
    }


def _sparse_adam_record(strategy) -> dict[str, object]:
    """A token embedding (indices repeat within a batch) trained with Adam."""
    keras = tf.keras

    def build():
        model = keras.Sequential([
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(20, 4, name="tokens"),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(2),
        ])
        model.compile(optimizer=keras.optimizers.Adam(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    rng = np.random.default_rng(1)
    x = rng.integers(0, 20, size=(NUM_EXAMPLES, 5)).astype("int32")
    y = (x[:, 0] > 9).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)
    single = build()
    with strategy.scope():
        model = build()
    model.set_weights(single.get_weights())
    with harness.absl_warnings() as warnings:
        model.fit(dataset, epochs=1, verbose=0)
    single.fit(dataset, epochs=1, verbose=0)
    return {
        "weights": model.get_weights(),
        "single_weights": single.get_weights(),
        "warnings": warnings,
    }


def _build(keras, steps_per_execution):
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(
                16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3)
            ),
            keras.layers.Dense(2),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def compare_with_one_device() -> dict[str, object]:
    keras = tf.keras
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    strategy = tfdist.ParameterServerStrategy(config, mode="sync", timeout_s=120)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 6)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)
    record: dict[str, object] = {}
    for steps_per_execution in (1, 3):
        try:
            single = _build(keras, steps_per_execution)
            with strategy.scope():
                model = _build(keras, steps_per_execution)
            model.set_weights(single.get_weights())
            before = dict(strategy.executions_by_worker)
            history = model.fit(dataset, epochs=EPOCHS, verbose=0)
            after = strategy.executions_by_worker
            single_history = single.fit(dataset, epochs=EPOCHS, verbose=0)
            record[steps_per_execution] = {
                "weights": model.get_weights(),
                "single_weights": single.get_weights(),
                "history": history.history,
                "single_history": single_history.history,
                "iterations": int(model.optimizer.iterations.numpy()),
                "functions": {w: after[w] - before.get(w, 0) for w in after},
                "evaluate": model.evaluate(x, y, batch_size=BATCH_SIZE, verbose=0),
                "single_evaluate": single.evaluate(x, y, batch_size=BATCH_SIZE, verbose=0),
            }
        except Exception as e:  # noqa: BLE001 - reported to the test.
            record[steps_per_execution] = {
                "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            }
    try:
        record["sparse_adam"] = _sparse_adam_record(strategy)
    except Exception as e:  # noqa: BLE001 - reported to the test.
        record["sparse_adam"] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    regression = tf.data.Dataset.from_tensor_slices((x, x[:, :1] - x[:, 1:2])).batch(BATCH_SIZE)
    try:
        record["custom_train_step"] = _custom_train_step_record(strategy, regression)
    except Exception as e:  # noqa: BLE001 - reported to the test.
        record["custom_train_step"] = {
            "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        }
    return record


class SyncModeTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.record,) = tfdist.testing.run_local_cluster(
            compare_with_one_device, num_workers=1, timeout_s=CLUSTER_TIMEOUT_S
        )

    def result(self, steps_per_execution):
        result = self.record[steps_per_execution]
        self.assertNotIn("error", result, result.get("error"))
        return result

    def check_equal_to_one_device(self, result):
        for got, expected in zip(result["weights"], result["single_weights"]):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        for key, values in result["single_history"].items():
            np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=key)
        np.testing.assert_allclose(result["evaluate"], result["single_evaluate"], rtol=1e-5)

    def test_fit_equals_one_device_with_the_same_global_batch(self):
        result = self.result(1)
        self.check_equal_to_one_device(result)
        self.assertEqual(result["iterations"], EPOCHS * NUM_BATCHES)

    def test_each_step_is_split_over_both_workers_and_applied_once(self):
        result = self.result(1)
        # Per step: one slice per worker, then one apply.
        self.assertEqual(sum(result["functions"].values()), EPOCHS * NUM_BATCHES * 3)
        self.assertEqual(sorted(result["functions"]), [0, 1])

    def test_steps_per_execution_equals_one_device(self):
        result = self.result(3)
        self.check_equal_to_one_device(result)
        self.assertEqual(result["iterations"], EPOCHS * NUM_BATCHES)

    def test_keras_guide_train_step_applies_each_step_once(self):
        # Under Keras 3 the guide's train_step calls optimizer.apply, and each
        # slice's call used to update the weights itself: one update per
        # slice plus the step's own (3 per step here).
        result = self.result("custom_train_step")
        self.assertEqual(result["single_iterations"], NUM_BATCHES)
        self.assertEqual(result["iterations"], NUM_BATCHES)
        for got, expected in zip(result["weights"], result["single_weights"]):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    def test_adam_on_repeated_token_rows_equals_one_device(self):
        # Keras 3's Adam squares each sparse row before adding an index's
        # rows: sync mode hands it the rows of both slices (it summed them
        # into one dense gradient before, and the table trained elsewhere).
        result = self.result("sparse_adam")
        for got, expected in zip(result["weights"], result["single_weights"]):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        self.assertEqual([w for w in result["warnings"] if "sparse" in w], [])

    def test_keras_guide_train_step_logs_one_devices_metrics(self):
        # Each slice returns metrics read when it ends, maybe before the
        # other slice's updates land; the step's logs are read after both.
        result = self.result("custom_train_step")
        self.assertEqual(sorted(result["history"]), sorted(result["single_history"]))
        for key, values in result["single_history"].items():
            np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=key)


if __name__ == "__main__":
    tfdist.testing.main()
