"""Multi-worker scaling: 2 workers vs 1, and tfdist vs TF's MultiWorkerMirroredStrategy.

    python benchmarks/multiworker.py [--steps=30] [--repeats=2]

Every task is a process on 127.0.0.1 (`tfdist.testing.run_local_cluster`)
with one intra-op thread, so each worker uses one of the 2 cores. Same
model and global batch everywhere:

- 1 worker, no strategy: throughput_1;
- 2 workers, tfdist.MultiWorkerMirroredStrategy: throughput_2 (gradients
  in 4 MiB buckets), and the same with compression="fp16";
- 2 workers, tf.distribute.MultiWorkerMirroredStrategy.

Scaling efficiency = throughput_2 / (2 * throughput_1). All runs use
tf-keras (TF_USE_LEGACY_KERAS=1): TF's own MultiWorkerMirroredStrategy
fails under Keras 3's `fit` (two Keras 3 bugs tfdist works around), so
tf-keras is the only front end where the baseline runs unmodified. Runs are
alternated per repeat; medians are reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np

from tfdist.testing import run_local_cluster

_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps per run.", lower_bound=2)
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs per configuration.", lower_bound=1)
GLOBAL_BATCH_SIZE = 256
ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_NUM_INTRAOP_THREADS": "1"}


def examples_per_second(kind: str, steps: int, compression: str | None = None) -> float:
    """Runs in each task: timed `fit` throughput of this task (examples/s)."""
    import tensorflow as tf

    import tfdist

    if kind == "tfdist":
        strategy = tfdist.MultiWorkerMirroredStrategy(compression=compression)
    elif kind == "tf":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()
    keras = tf.keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(GLOBAL_BATCH_SIZE * steps, 256)).astype("float32")
    y = rng.integers(0, 10, GLOBAL_BATCH_SIZE * steps).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        GLOBAL_BATCH_SIZE, drop_remainder=True).repeat()
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((256,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)  # Trace, warm up.
    start = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    return GLOBAL_BATCH_SIZE * steps / (time.perf_counter() - start)


def main(argv: Sequence[str]) -> None:
    del argv
    configs = {"1 worker, no strategy": ("single", 1, None),
               "2 workers, tfdist.MultiWorkerMirroredStrategy": ("tfdist", 2, None),
               "2 workers, tfdist, compression='fp16'": ("tfdist", 2, "fp16"),
               "2 workers, tf.distribute.MultiWorkerMirroredStrategy": ("tf", 2, None)}
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(_REPEATS.value):
        for name, (kind, workers, compression) in configs.items():
            per_task = run_local_cluster(
                examples_per_second, num_workers=workers,
                args=(kind, _STEPS.value, compression),
                timeout_s=300, env=ENV)
            rates[name].append(min(per_task))  # The job runs at its slowest task's pace.
    median = {name: statistics.median(r) for name, r in rates.items()}
    single = median["1 worker, no strategy"]
    tf_rate = median["2 workers, tf.distribute.MultiWorkerMirroredStrategy"]
    print(f"\n### global batch {GLOBAL_BATCH_SIZE}, MLP 256->512->512->10, "
          f"1 intra-op thread per task, tf-keras\n")
    print("| configuration | examples/s | scaling efficiency | vs TF's MWMS |")
    print("|---|---|---|---|")
    for name, rate in median.items():
        workers = configs[name][1]
        efficiency = rate / (workers * single) if workers > 1 else 1.0
        print(f"| {name} | {rate:,.0f} | {efficiency:.2f} | {rate / tf_rate:.2f}x |")


if __name__ == "__main__":
    app.run(main)
