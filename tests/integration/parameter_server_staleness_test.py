"""Bounded staleness (`max_staleness=k`) of tfdist.ParameterServerStrategy, measured.

Each setting trains in its own child process (an in-process cluster of 2
workers and 1 ps; `fit` on a finite dataset) and reports the strategy's
`largest_staleness_seen`: for every step, the steps of other functions
that ran while it ran, an upper bound on how stale its update was.
Unbounded asynchronous training is measured too: it overlaps steps
(staleness > 0), so the bounded runs' 0 and <= k are the window's doing,
not an instrument that cannot see overlap. Runs under Keras 3 and tf-keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfdist

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

NUM_EXAMPLES = 2048
BATCH_SIZE = 32
CLUSTER_TIMEOUT_S = 300


def train(max_staleness, steps_per_execution) -> dict[str, object]:
    keras = tf.keras
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=1)
    strategy = tfdist.ParameterServerStrategy(
        config, max_staleness=max_staleness, timeout_s=120
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 32)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution,
        )
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)
    history = model.fit(dataset, epochs=2, verbose=0)
    return {
        "largest_staleness_seen": strategy.largest_staleness_seen,
        "executions_by_worker": strategy.executions_by_worker,
        "iterations": int(model.optimizer.iterations.numpy()),
        "loss": history.history["loss"],
    }


def _run(max_staleness, steps_per_execution=1):
    (result,) = tfdist.testing.run_local_cluster(
        train,
        num_workers=1,
        args=(max_staleness, steps_per_execution),
        timeout_s=CLUSTER_TIMEOUT_S,
    )
    return result


class BoundedStalenessTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.results = {
            "unbounded": _run(None),
            "k0": _run(0),
            "k2": _run(2),
            "k2_spe2": _run(2, steps_per_execution=2),
        }

    def check_trained(self, result, steps_per_execution=1):
        steps = 2 * NUM_EXAMPLES // BATCH_SIZE
        self.assertEqual(result["iterations"], steps)
        self.assertEqual(
            sum(result["executions_by_worker"].values()), steps // steps_per_execution
        )
        self.assertLess(result["loss"][-1], result["loss"][0])

    def test_unbounded_async_runs_steps_at_the_same_time(self):
        result = self.results["unbounded"]
        self.check_trained(result)
        self.assertGreater(result["largest_staleness_seen"], 0)

    def test_max_staleness_zero_never_overlaps_steps(self):
        result = self.results["k0"]
        self.check_trained(result)
        self.assertEqual(result["largest_staleness_seen"], 0)
        # Still on both workers: one at a time, not one worker.
        self.assertEqual(sorted(result["executions_by_worker"]), [0, 1])

    def test_max_staleness_two_holds(self):
        result = self.results["k2"]
        self.check_trained(result)
        self.assertLessEqual(result["largest_staleness_seen"], 2)

    def test_max_staleness_counts_every_step_of_a_function(self):
        # k=2 with 2 steps per function: one function at a time.
        result = self.results["k2_spe2"]
        self.check_trained(result, steps_per_execution=2)
        self.assertEqual(result["largest_staleness_seen"], 0)


if __name__ == "__main__":
    tfdist.testing.main()
