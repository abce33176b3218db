"""tfdist.ParameterServerStrategy as a real job: chief + 2 workers + 2 ps processes.

Every task runs the same function (`train_job`), as every task of a
`python -m tfdist.launch --chief --workers 2 --ps 2` job runs the same
script: the strategy serves on the workers and ps tasks and trains on the
chief, whose return ends the job (`tfdist.testing.run_local_ps_job`, the
launcher's parameter-server rules). Runs under Keras 3 and tf-keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfdist

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

JOB_TIMEOUT_S = 300
NUM_EXAMPLES = 256
BATCH_SIZE = 32


def train_job() -> dict[str, object]:
    """The script of every task; returns (on the chief) what fit saw."""
    keras = tf.keras
    strategy = tfdist.ParameterServerStrategy(timeout_s=120)  # Serves on worker/ps.
    config = strategy.cluster_config
    rng = np.random.default_rng(1)
    x = rng.normal(size=(NUM_EXAMPLES, 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(NUM_EXAMPLES).batch(BATCH_SIZE)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.02),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(dataset, epochs=4, verbose=0)
    return {
        "task": config.task.name,
        "devices": sorted(
            {(v.device if hasattr(v, "device") else v.value.device).split("/device")[0]
             for v in model.weights}
        ),
        "iterations": int(model.optimizer.iterations.numpy()),
        "loss": history.history["loss"],
        "evaluate": model.evaluate(x, y, batch_size=BATCH_SIZE, verbose=0),
        "predict_rows": model.predict(x, batch_size=BATCH_SIZE, verbose=0).shape,
        "executions_by_worker": strategy.executions_by_worker,
    }


class ParameterServerJobTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.result = tfdist.testing.run_local_ps_job(
            train_job, num_workers=2, num_ps=2, timeout_s=JOB_TIMEOUT_S
        )

    def test_the_chief_returns(self):
        self.assertEqual(self.result["task"], "chief:0")

    def test_variables_live_on_both_ps_tasks(self):
        self.assertEqual(
            self.result["devices"], ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]
        )

    def test_fit_runs_every_batch_on_the_workers(self):
        self.assertEqual(self.result["iterations"], 4 * NUM_EXAMPLES // BATCH_SIZE)
        self.assertEqual(sorted(self.result["executions_by_worker"]), [0, 1])
        self.assertLess(self.result["loss"][-1], self.result["loss"][0])

    def test_evaluate_and_predict(self):
        loss, accuracy = self.result["evaluate"]
        self.assertGreater(accuracy, 0.8)
        self.assertEqual(self.result["predict_rows"], (NUM_EXAMPLES, 2))


if __name__ == "__main__":
    tfdist.testing.main()
