"""Parameter-server training: tfdist.ParameterServerStrategy vs TF's, steps per second.

    python benchmarks/ps.py [--steps=200] [--rounds=3] [--only=NAME ...]

Each run is its own process (`tfdist.testing.run_local_cluster`, one
task) holding an in-process cluster of 2 workers and 2 ps
(`tfdist.testing.start_local_ps_cluster`: servers with the inter-op
threads TF's runtime needs). Same model (MLP 32->256->256->10, 0.08 M
parameters, variables round robin over the 2 ps), same batch (64), same
data. Configurations:

- tfdist async, Keras 3 (a finite dataset, as on one device);
- tfdist async, tf-keras;
- TF's `tf.distribute.ParameterServerStrategy`, tf-keras (its own
  ClusterCoordinator path: `repeat()` + `steps_per_epoch`);
- tfdist sync, Keras 3 (each batch split over the 2 workers, applied once:
  2 slices + 1 apply per step, so at most about a third of async's rate);
- tfdist async with `exactly_once=False` (Keras 3 and tf-keras): what
  exactly-once updates of a step cut short cost
  (`tfdist.parameter_server.update_gate`);
- tfdist async with `input_service="chief"` (Keras 3 and tf-keras): the
  workers read their batches from a tf.data service in the chief's
  process instead of receiving them with each step
  (`tfdist.parameter_server.service_input`).

Steps/s is measured over the second epoch (the first includes tracing),
and so is the CPU time of the whole process (chief, workers and ps tasks
all run in it) per step: on a machine of few cores, where every task
competes for them, CPU per step varies less from run to run than steps/s.
Configurations alternate per round; medians are reported. Keras 3 cannot
run TF's strategy at all (its `fit` has no ClusterCoordinator path), so
the TF baseline is tf-keras.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from absl import app
from absl import flags

from tfdist.testing import run_local_cluster

_STEPS = flags.DEFINE_integer("steps", 200, "Steps per epoch.", lower_bound=20)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Runs per configuration.", lower_bound=1)

BATCH_SIZE = 64
#: name -> (strategy, mode, TF_USE_LEGACY_KERAS)
CONFIGURATIONS = {
    "tfdist async, Keras 3": ("tfdist", "async", "0"),
    "tfdist async, tf-keras": ("tfdist", "async", "1"),
    "TF ParameterServerStrategy, tf-keras": ("tf", "async", "1"),
    "tfdist sync, Keras 3": ("tfdist", "sync", "0"),
    "tfdist async, Keras 3, exactly_once=False": ("tfdist-ungated", "async", "0"),
    "tfdist async, tf-keras, exactly_once=False": ("tfdist-ungated", "async", "1"),
    "tfdist async, Keras 3, input_service='chief'": ("tfdist-service", "async", "0"),
    "tfdist async, tf-keras, input_service='chief'": ("tfdist-service", "async", "1"),
}
_ONLY = flags.DEFINE_multi_string(
    "only", None, "Run only this configuration (repeatable; TF's, the baseline, always runs), by name."
)


def measure(strategy_name: str, mode: str, steps: int) -> tuple[float, float]:
    """Runs in the child: steps/s and CPU ms per step (whole process) of the second epoch."""
    import os

    import numpy as np
    import tensorflow as tf

    import tfdist

    keras = tf.keras
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    if strategy_name.startswith("tfdist"):
        strategy = tfdist.ParameterServerStrategy(
            config,
            mode=mode,
            timeout_s=120,
            exactly_once=strategy_name != "tfdist-ungated",
            input_service="chief" if strategy_name == "tfdist-service" else None,
        )
    else:
        strategy = tf.distribute.ParameterServerStrategy(
            tfdist.cluster.to_cluster_resolver(config)
        )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH_SIZE, 32)).astype("float32")
    y = rng.integers(0, 10, size=steps * BATCH_SIZE).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(256, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []
            self.cpu_seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()
            self.cpu_start = sum(os.times()[:2])

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)
            self.cpu_seconds.append(sum(os.times()[:2]) - self.cpu_start)

    clock = EpochClock()
    if strategy_name.startswith("tfdist"):
        model.fit(dataset, epochs=2, verbose=0, callbacks=[clock])
    else:  # TF's path needs an infinite dataset and steps_per_epoch.
        model.fit(dataset.repeat(), epochs=2, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    return steps / clock.seconds[1], 1000 * clock.cpu_seconds[1] / steps


def main(argv: Sequence[str]) -> None:
    del argv
    baseline_name = "TF ParameterServerStrategy, tf-keras"
    chosen = {
        name: value
        for name, value in CONFIGURATIONS.items()
        if _ONLY.value is None or name in _ONLY.value or name == baseline_name
    }
    results: dict[str, list[float]] = {name: [] for name in chosen}
    cpu: dict[str, list[float]] = {name: [] for name in chosen}
    for round_index in range(_ROUNDS.value):
        for name, (strategy_name, mode, legacy) in chosen.items():
            ((rate, cpu_ms),) = run_local_cluster(
                measure,
                num_workers=1,
                args=(strategy_name, mode, _STEPS.value),
                env={"TF_USE_LEGACY_KERAS": legacy},
                timeout_s=600,
            )
            results[name].append(rate)
            cpu[name].append(cpu_ms)
            print(
                f"round {round_index + 1}: {name}: {rate:.1f} steps/s, {cpu_ms:.2f} CPU ms/step",
                flush=True,
            )
    baseline = statistics.median(results[baseline_name])
    baseline_cpu = statistics.median(cpu[baseline_name])
    print(
        "\n| configuration | steps/s (median) | vs TF's PS strategy (tf-keras) "
        "| CPU ms/step (median) | CPU vs TF's |"
    )
    print("|---|---|---|---|---|")
    for name, rates in results.items():
        median = statistics.median(rates)
        median_cpu = statistics.median(cpu[name])
        print(
            f"| {name} | {median:.1f} | {median / baseline:.2f}x | {median_cpu:.2f} "
            f"| {median_cpu / baseline_cpu:.2f}x |"
        )


if __name__ == "__main__":
    app.run(main)
