"""tfdist.MeshStrategy across a 2-worker TF_CONFIG cluster on 127.0.0.1 (DTensor multi-client).

Each worker has 2 logical CPUs; the mesh spans all 4 devices, worker-major,
the batch axis first: {"batch": 2, "model": 2} (data parallel between the
workers, every Dense layer split over each worker's two CPUs) and
{"batch": 4, "model": 1} (data parallel over all four). Training through
`model.fit`, `evaluate` and `predict` must equal one device with the same
global batch, a short last batch included; a bad mesh gives a `tfdist` error. Runs under Keras 3 and
(TF_USE_LEGACY_KERAS=1) tf-keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.integration import multi_worker_fit_test
from tfdist.testing import run_local_cluster

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

# The multi-worker test's tolerances, batch and examples: 118 = 3 * 32 + 22,
# a short last step, which the batch axis (2 or 4 positions) divides into
# 11 + 11 rows or not (6 + 6 + 5 + 5).
FLOAT32_RTOL = multi_worker_fit_test.FLOAT32_RTOL
FLOAT32_ATOL = multi_worker_fit_test.FLOAT32_ATOL
GLOBAL_BATCH_SIZE = multi_worker_fit_test.GLOBAL_BATCH_SIZE
NUM_EXAMPLES = multi_worker_fit_test.NUM_EXAMPLES
CLUSTER_TIMEOUT_S = multi_worker_fit_test.CLUSTER_TIMEOUT_S
#: Megatron's pair: the first Dense by output columns, the second by input rows.
LAYOUT_MAP = {
    ".*dense/kernel": (None, "model"),
    ".*dense/bias": ("model",),
    ".*dense_1/kernel": ("model", None),
}


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 8)).astype("float32")
    y = rng.integers(0, 3, NUM_EXAMPLES).astype("int32")
    return x, y


def _model():
    keras = tf.keras
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu", name="dense"),
        keras.layers.Dense(3, name="dense_1"),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def train(mesh: dict | None) -> dict[str, object]:
    """Fits the test model; with `mesh`, under MeshStrategy on the TF_CONFIG cluster."""
    if mesh is None:
        strategy = tf.distribute.get_strategy()
    else:
        tfdist.simulate_cpu_devices(2)
        strategy = tfdist.MeshStrategy(mesh, layout_map=LAYOUT_MAP)
    x, y = _data()
    with strategy.scope():
        model = _model()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0)
    result = {
        "weights": model.get_weights(),
        "loss": history.history["loss"],
        "evaluate": model.evaluate(x, y, batch_size=GLOBAL_BATCH_SIZE, verbose=0),
        "predict": model.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0),
    }
    if mesh is not None:
        result["bytes"] = strategy.bytes_per_device()
    return result


def error_of(mesh: dict) -> str:
    """The tfdist error a worker gets for `mesh`, as 'ClassName: message'."""
    tfdist.simulate_cpu_devices(2)
    try:
        tfdist.MeshStrategy(mesh)
    except tfdist.errors.TfdistError as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


class MeshAcrossWorkersTest(tf.test.TestCase, parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.reference = train(None)

    @parameterized.named_parameters(
        ("batch_between_workers_model_within", {"batch": 2, "model": 2}),
        ("batch_over_all_four", {"batch": 4, "model": 1}),
    )
    def test_fit_evaluate_predict_match_one_device(self, mesh):
        workers = run_local_cluster(train, num_workers=2, args=(mesh,), timeout_s=CLUSTER_TIMEOUT_S)
        for worker in workers:
            for a, b in zip(worker["weights"], self.reference["weights"]):
                self.assertAllClose(a, b, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL)
            for key in ("loss", "evaluate", "predict"):
                self.assertAllClose(worker[key], self.reference[key],
                                    rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, msg=key)
        held, whole = workers[0]["bytes"]
        if mesh["model"] == 2:
            # Both kernels and the first bias split in two: each device holds about half.
            self.assertLess(held, 0.6 * whole)
        else:
            self.assertEqual(held, whole)

    def test_model_axis_spanning_workers_raises_layout_error(self):
        messages = run_local_cluster(
            error_of, num_workers=2, args=({"batch": 1, "model": 4},), timeout_s=CLUSTER_TIMEOUT_S)
        for message in messages:
            self.assertRegex(
                message, r"LayoutError: on a cluster of 2 workers with 2 device\(s\) each, the mesh "
                r"\{'batch': 1, 'model': 4\} must .* \(their sizes' product, 4, must divide 2\)")


if __name__ == "__main__":
    tfdist.testing.main()
