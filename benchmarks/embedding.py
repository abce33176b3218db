"""Embedding tables on parameter servers: bytes per step and steps/s as the table grows.

    python benchmarks/embedding.py [--rows=10000,100000,1000000] [--steps=100] [--rounds=2]

Each run is its own process (`tfdist.testing.run_local_cluster`, one task,
in a private network namespace where the OS allows: then the loopback
interface carries only this run's traffic) holding an in-process cluster of
2 workers and 2 ps. The model is a matrix factorisation like
examples/recommender.py's (a user table of `rows` x 16 float32, split over
the 2 ps by a partitioner; an item table of 1000 rows), batch 256, under Keras 3 with `tfdist.ParameterServerStrategy`
(async). Two update rules:

- sparse: SGD. Each step gathers its batch's rows from the shards that own
  them and scatters their updates back: the traffic of a step should not
  depend on the table's size.
- dense: Adam. The same sparse lookups, but Keras 3's Adam updates every row
  of the table and of its two slots each step (its update rule mixes the
  gradient with dense slots): traffic grows with the table.
- TF, sparse: TF's `tf.distribute.ParameterServerStrategy` under tf-keras
  (Keras 3 cannot train a split table on it), the same partitioner, SGD,
  its own ClusterCoordinator path (`repeat()` + `steps_per_epoch`): the
  baseline for the sparse row.

Bytes per step: the loopback interface's received bytes over the second
epoch (/proc/net/dev, isolated runs only), divided by its steps; they count
every gRPC message of the cluster (chief, workers and ps talk over
127.0.0.1). Steps/s over the same epoch (the first includes tracing).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from absl import app
from absl import flags

from tfdist.testing import run_local_cluster

_ROWS = flags.DEFINE_list("rows", ["10000", "100000", "1000000"], "User table sizes.")
_STEPS = flags.DEFINE_integer("steps", 100, "Steps per epoch.", lower_bound=10)
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Runs per configuration.", lower_bound=1)

BATCH_SIZE = 256
#: name -> (strategy, optimizer, TF_USE_LEGACY_KERAS)
CONFIGURATIONS = {
    "tfdist, Keras 3, sparse (SGD)": ("tfdist", "sgd", "0"),
    "tfdist, Keras 3, dense (Adam)": ("tfdist", "adam", "0"),
    "TF PS strategy, tf-keras, sparse (SGD)": ("tf", "sgd", "1"),
}


def _loopback_received_bytes() -> int | None:
    """Bytes received on `lo` in this network namespace, or None if unreadable."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    return int(counters.split()[0])
    except OSError:
        return None
    return None


def measure(rows: int, strategy_name: str, optimizer: str, steps: int) -> tuple[float, float | None]:
    """Runs in the child: (steps/s, loopback bytes per step) of the second epoch."""
    import numpy as np
    import tensorflow as tf

    import tfdist

    keras = tf.keras
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=1 << 16, max_shards=2
    )
    if strategy_name == "tfdist":
        strategy = tfdist.ParameterServerStrategy(config, variable_partitioner=partitioner)
    else:
        strategy = tf.distribute.ParameterServerStrategy(
            tfdist.cluster.to_cluster_resolver(config), variable_partitioner=partitioner
        )
    rng = np.random.default_rng(0)
    n = steps * BATCH_SIZE
    features = {
        "user": rng.integers(0, rows, size=n).astype("int64"),
        "item": rng.integers(0, 1000, size=n).astype("int64"),
    }
    labels = rng.integers(0, 2, size=(n, 1)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(BATCH_SIZE)
    with strategy.scope():
        user = keras.Input((), dtype="int64", name="user")
        item = keras.Input((), dtype="int64", name="item")
        user_vector = keras.layers.Embedding(rows, 16)(user)
        item_vector = keras.layers.Embedding(1000, 16)(item)
        logit = keras.layers.Dot(axes=1)([user_vector, item_vector])
        model = keras.Model({"user": user, "item": item}, logit)
        model.compile(
            optimizer=keras.optimizers.SGD(1.0) if optimizer == "sgd" else keras.optimizers.Adam(),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
        )

    class EpochClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.bytes_begin = _loopback_received_bytes()
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.start
            end = _loopback_received_bytes()
            self.bytes = None if end is None or self.bytes_begin is None else end - self.bytes_begin

    clock = EpochClock()
    if strategy_name == "tfdist":
        model.fit(dataset, epochs=2, verbose=0, callbacks=[clock])
    else:  # TF's path needs an infinite dataset and steps_per_epoch.
        model.fit(dataset.repeat(), epochs=2, steps_per_epoch=steps, verbose=0,
                  callbacks=[clock])
    return steps / clock.seconds, None if clock.bytes is None else clock.bytes / steps


def main(argv: Sequence[str]) -> None:
    del argv
    rows_list = [int(r) for r in _ROWS.value]
    rates: dict[tuple[int, str], list[float]] = {}
    traffic: dict[tuple[int, str], list[float]] = {}
    for round_index in range(_ROUNDS.value):
        for rows in rows_list:
            for name, (strategy_name, optimizer, legacy) in CONFIGURATIONS.items():
                ((rate, per_step),) = run_local_cluster(
                    measure, num_workers=1, args=(rows, strategy_name, optimizer, _STEPS.value),
                    env={"TF_USE_LEGACY_KERAS": legacy}, timeout_s=900,
                )
                rates.setdefault((rows, name), []).append(rate)
                if per_step is not None:
                    traffic.setdefault((rows, name), []).append(per_step)
                shown = "n/a" if per_step is None else f"{per_step / 1024:,.0f} KiB"
                print(f"round {round_index + 1}: rows={rows:,} {name}: {rate:.1f} steps/s, "
                      f"{shown} per step", flush=True)
    baseline_name = "TF PS strategy, tf-keras, sparse (SGD)"
    print("\n| table rows | configuration | steps/s (median) | vs TF (tf-keras, SGD) "
          "| loopback KiB per step (median) |")
    print("|---|---|---|---|---|")
    for rows in rows_list:
        baseline = statistics.median(rates[(rows, baseline_name)])
        for name in CONFIGURATIONS:
            rate = statistics.median(rates[(rows, name)])
            kib = traffic.get((rows, name))
            shown = "n/a" if not kib else f"{statistics.median(kib) / 1024:,.0f}"
            print(f"| {rows:,} | {name} | {rate:.1f} | {rate / baseline:.2f}x | {shown} |")


if __name__ == "__main__":
    app.run(main)
