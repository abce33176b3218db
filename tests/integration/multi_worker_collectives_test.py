"""How many cross-worker collectives one training step of `fit` runs (tfdist.MultiWorkerMirroredStrategy).

Counted, after each step of an 8-step `fit` on 2 workers (a callback; the
read waits for the step), by the strategy's own collective clock
(`tfdist/watchdog/clock.py`, which brackets every collective TF's
launchers create) and its host-memory group's calls (the default
transport of workers on one host), so each difference is one step's
collectives: the gradients' buckets only (the test model's fit in one),
under both front ends and both transports. The values Keras
reduces for its logs ride in a bucket (`tfdist/collectives/fused_step.py`);
as Keras writes the step they took one more collective under Keras 3
(tfdist packs its logged values) and six more under tf-keras (its loss and
accuracy metrics' total and count, then each logged result).

With compression the logged values still ride, bit for bit: the riders'
own test sums values that float16 cannot hold.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.front_end import KERAS_3
from tfdist.testing import run_local_cluster

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

GRADIENT_BUCKETS = 1  # small_classifier's gradients: a few hundred bytes, one bucket.
LOG_COLLECTIVES = 0  # Unfused: 1 under Keras 3, 6 under tf-keras.


def collectives_per_step(compression: str | None, transport: str) -> dict[str, object]:
    """In each task: the collectives of each step of `fit` after the first (TF's, host memory's), and its logs."""
    keras = tf.keras
    strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=60, compression=compression, transport=transport)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 8)).astype("float32")
    y = rng.integers(0, 3, 640).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
    with strategy.scope():
        model = tfdist.testing.small_classifier(keras.optimizers.SGD(0.1))
    clock = strategy._watchdog._clock  # noqa: SLF001 - the strategy's own count.
    group = strategy.cross_device_ops.host_group
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(
            (clock.counts()[0], group.calls if group is not None else 0)
        )
    )
    history = model.fit(dataset, epochs=1, steps_per_epoch=8, verbose=0, callbacks=[record])
    return {
        "transport": strategy.transport,
        "per_step": [(b[0] - a[0], b[1] - a[1]) for a, b in zip(seen, seen[1:])],
        "logs": {k: v[-1] for k, v in history.history.items()},
    }


def riders_summed(compression: str | None, transport: str) -> list:
    """In each task: its transport, then float32 riders that float16 and bfloat16 cannot hold, summed beside a gradient."""
    strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=60, compression=compression, transport=transport)
    task = strategy.cluster_config.worker_index
    gradient = tf.fill([64], 0.5 + task)
    riders = [tf.constant(1 + 2.0 ** -20 + task, tf.float32), tf.constant([1e-8, 70000.5 * (task + 1)], tf.float32)]

    @tf.function
    def step():
        def replica_fn():
            def merge(strategy, gradient, *riders):
                return strategy.cross_device_ops.batch_reduce_with_riders([gradient], list(riders))
            return tf.distribute.get_replica_context().merge_call(merge, args=(gradient, *riders))
        return strategy.run(replica_fn)

    (summed_gradient,), sums = step()
    return [strategy.transport, summed_gradient.numpy()] + [s.numpy() for s in sums]


def overrides_and_custom_reduces() -> dict[str, object]:
    """In each task: a `compute_metrics` override's logs, and SUM/MEAN of a train step's loss in a custom loop."""
    keras = tf.keras

    class LogsStepCount(keras.Sequential):
        # Reads the optimizer after the update, as Keras orders a step: such
        # a model is not fused (tfdist/collectives/fused_step.py).
        def compute_metrics(self, *args, **kwargs):
            logs = dict(super().compute_metrics(*args, **kwargs))
            logs["iterations"] = tf.cast(self.optimizer.iterations, tf.float32)
            return logs

    strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=60)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.integers(0, 3, 64).astype("int32")
    with strategy.scope():
        model = LogsStepCount([keras.Input((8,)), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(logs["iterations"]))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[record])
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))

    @tf.function
    def step(data):
        logs = strategy.run(model.train_step, args=(data,))
        return strategy.reduce("SUM", logs["loss"], axis=None), strategy.reduce("MEAN", logs["loss"], axis=None)

    summed, mean = step(next(iter(dataset)))
    return {"iterations": [float(v) for v in seen], "sum": float(summed), "mean": float(mean)}


class CollectivesPerStepTest(parameterized.TestCase):

    def test_a_compute_metrics_override_and_a_custom_loops_reduces_run_as_written(self):
        results = run_local_cluster(overrides_and_custom_reduces, num_workers=2, timeout_s=150)
        # Unfused, tf-keras sums each per-step log over the workers (its epoch
        # logs are right): known, docs/multi_worker.md.
        scale = 1.0 if KERAS_3 else 2.0
        for result in results:
            # Logged after each step's update, as Keras orders a step.
            self.assertEqual(result["iterations"], [scale * i for i in (1.0, 2.0, 3.0, 4.0)])
            # The custom loop's SUM is over the 2 replicas, its MEAN their mean.
            self.assertAlmostEqual(result["sum"], 2 * result["mean"], places=5)


    @parameterized.named_parameters(
        # (TF's collectives, host-memory calls) per step.
        ("plain_host_memory", None, "auto", (0, GRADIENT_BUCKETS + LOG_COLLECTIVES)),
        ("fp16_grpc", "fp16", "grpc", (GRADIENT_BUCKETS + LOG_COLLECTIVES, 0)),
    )
    def test_a_step_runs_the_gradient_buckets_only(self, compression, transport, per_step):
        results = run_local_cluster(
            collectives_per_step, num_workers=2, args=(compression, transport), timeout_s=150
        )
        for result in results:
            self.assertEqual(result["transport"], "host_memory" if transport == "auto" else transport)
            self.assertEqual(result["per_step"], [per_step] * 7)
        self.assertEqual(results[0]["logs"], results[1]["logs"])

    # Compressed only: uncompressed riders are summed by the all-reduce itself,
    # as the logs of the test above show.
    @parameterized.named_parameters(("fp16_grpc", "fp16", "grpc"), ("bf16_host_memory", "bf16", "auto"))
    def test_riders_are_summed_exactly_beside_the_gradients(self, compression, transport):
        results = run_local_cluster(riders_summed, num_workers=2, args=(compression, transport), timeout_s=150)
        expected = [
            np.full([64], 2.0, np.float32),  # 0.5 + 1.5: exact in every wire dtype.
            np.float32(1 + 2.0 ** -20) + np.float32(2 + 2.0 ** -20),
            np.array([2e-8, 70000.5 * 3], np.float32),
        ]
        for result in results:
            self.assertEqual(result[0], "host_memory" if transport == "auto" else transport)
            for got, want in zip(result[1:], expected, strict=True):
                np.testing.assert_array_equal(got, want)


if __name__ == "__main__":
    tfdist.testing.main()
