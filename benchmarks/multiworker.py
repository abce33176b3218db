"""Multi-worker scaling: 2 workers vs 1, and tfdist vs TF's MultiWorkerMirroredStrategy.

    python benchmarks/multiworker.py [--workload=comm_bound|compute_bound] [--rounds=3]
        [--keras=tf_keras|keras3] [--network=isolated|host|both]

Every task is a process on 127.0.0.1 (`tfdist.testing.run_local_cluster`)
with one intra-op thread and **pinned to one core** (task i to core i), so
"one worker" means one core's worth of compute and the 2-worker runs get
two: without pinning, one worker's inter-op and tf.data threads already
spread over both cores of this machine and there is nothing left to scale
onto. Same model and global batch everywhere:

- 1 worker, no strategy: throughput_1;
- 2 workers, tfdist.MultiWorkerMirroredStrategy: throughput_2 (gradients in
  4 MiB buckets) with its default transport (shared memory between tasks
  of one host), with transport="grpc" (TF's collectives, the path of
  several hosts), and with transport="grpc", compression="fp16";
- 2 workers, tf.distribute.MultiWorkerMirroredStrategy.

Throughput comes from the steady-state step time (median step of a `fit`,
first steps left out). Scaling efficiency = throughput_2 / (2 *
throughput_1). Workloads (MLP 256->512->512->10, 0.4 M parameters, 1.6 MB
of float32 gradients per step):

- comm_bound: global batch 256 (the issue's setting: ~14 ms of compute per
  step on one core, so per-step communication dominates);
- compute_bound: global batch 4096 (~160 ms of compute per step).

By default all runs use tf-keras (TF_USE_LEGACY_KERAS=1): TF's own
MultiWorkerMirroredStrategy fails under Keras 3's `fit` (two Keras 3 bugs
tfdist works around), so tf-keras is where the baseline runs unmodified.
`--keras=keras3` measures tfdist's scaling under Keras 3 (no TF baseline).
`--network` says where the tasks talk: `isolated` (a private network
namespace, tfdist-launch's default), `host` (the host's network,
`--no-isolate`) or `both`, each configuration run on both in turn, with a
table comparing them. Configurations alternate per round; medians are
reported.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np

from tfdist.testing import run_local_cluster

_STEPS = flags.DEFINE_integer("steps", 40, "Timed steps per run.", lower_bound=10)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Runs per configuration.", lower_bound=1)
_WORKLOAD = flags.DEFINE_enum(
    "workload", "comm_bound", ["comm_bound", "compute_bound"], "Global batch size.")
_KERAS = flags.DEFINE_enum(
    "keras", "tf_keras", ["tf_keras", "keras3"],
    "Keras front end; TF's MultiWorkerMirroredStrategy runs only under tf_keras.")
_NETWORK = flags.DEFINE_enum(
    "network", "isolated", ["isolated", "host", "both"],
    "Where the tasks' servers listen: a private network namespace, the host's "
    "network, or both (alternated).")
GLOBAL_BATCH_SIZE = {"comm_bound": 256, "compute_bound": 4096}
WARMUP_STEPS = 5
ENV = {"TF_NUM_INTRAOP_THREADS": "1"}
CONFIGS = {
    # name: (strategy kind, workers, tfdist's keyword arguments)
    "1 worker, no strategy": ("single", 1, {}),
    "2 workers, tfdist.MultiWorkerMirroredStrategy (shared memory)": ("tfdist", 2, {}),
    "2 workers, tfdist, transport='grpc'": ("tfdist", 2, {"transport": "grpc"}),
    "2 workers, tfdist, transport='grpc', compression='fp16'": (
        "tfdist", 2, {"transport": "grpc", "compression": "fp16"}),
    "2 workers, tf.distribute.MultiWorkerMirroredStrategy": ("tf", 2, {}),
}
BASELINE = "2 workers, tf.distribute.MultiWorkerMirroredStrategy"


def pin_to_own_core() -> None:
    """Restricts this task (and the threads it starts later) to core task_id."""
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    os.sched_setaffinity(0, {task.get("index", 0) % os.cpu_count()})


def step_seconds(kind: str, global_batch_size: int, steps: int,
                 tfdist_kwargs: dict | None = None) -> float:
    """Runs in each task: median steady-state seconds per training step."""
    pin_to_own_core()  # Before TensorFlow starts its threads.
    import tensorflow as tf

    import tfdist

    if kind == "tfdist":
        strategy = tfdist.MultiWorkerMirroredStrategy(**(tfdist_kwargs or {}))
    elif kind == "tf":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()
    if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
        keras = tf.keras
    else:
        import keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch_size * 8, 256)).astype("float32")
    y = rng.integers(0, 10, global_batch_size * 8).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        global_batch_size, drop_remainder=True).cache().repeat()
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

    class StepClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.stamps = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())

    clock = StepClock()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    return float(np.median(np.diff(clock.stamps)[WARMUP_STEPS:]))


def main(argv: Sequence[str]) -> None:
    del argv
    batch = GLOBAL_BATCH_SIZE[_WORKLOAD.value]
    tf_keras = _KERAS.value == "tf_keras"
    env = {**ENV, "TF_USE_LEGACY_KERAS": "1"} if tf_keras else ENV
    configs = {name: config for name, config in CONFIGS.items()
               if tf_keras or config[0] != "tf"}
    networks = ["isolated", "host"] if _NETWORK.value == "both" else [_NETWORK.value]
    step_s = {network: {name: [] for name in configs} for network in networks}
    for _ in range(_ROUNDS.value):
        for name, (kind, workers, tfdist_kwargs) in configs.items():
            for network in networks:
                per_task = run_local_cluster(
                    step_seconds, num_workers=workers,
                    args=(kind, batch, _STEPS.value, tfdist_kwargs),
                    timeout_s=600, env=env, isolate=network == "isolated")
                # The job runs at its slowest task's pace.
                step_s[network][name].append(max(per_task))
    for network in networks:
        print_table(network, batch, step_s[network])
    if len(networks) == 2:
        print("\n| configuration | isolated ms/step | host network ms/step | isolated / host |")
        print("|---|---|---|---|")
        for name in configs:
            isolated, host = (statistics.median(step_s[n][name]) for n in networks)
            print(f"| {name} | {isolated * 1e3:.1f} | {host * 1e3:.1f} | "
                  f"{isolated / host:.2f} |")


def print_table(network: str, batch: int, step_s: dict[str, list[float]]) -> None:
    """Prints one network's results: step time, scaling, and vs TF."""
    rate = {name: batch / statistics.median(s) for name, s in step_s.items()}
    single = rate["1 worker, no strategy"]
    print(f"\n### {_WORKLOAD.value}: global batch {batch}, MLP 256->512->512->10, "
          f"1 intra-op thread and 1 core per task, {_KERAS.value}, {network} network, "
          f"median of {_ROUNDS.value}\n")
    print("| configuration | ms/step | examples/s | scaling efficiency | vs TF's MWMS |")
    print("|---|---|---|---|---|")
    for name, examples_per_s in rate.items():
        workers = CONFIGS[name][1]
        efficiency = examples_per_s / (workers * single) if workers > 1 else 1.0
        versus_tf = f"{examples_per_s / rate[BASELINE]:.2f}x" if BASELINE in rate else "n/a"
        print(f"| {name} | {batch / examples_per_s * 1e3:.1f} | {examples_per_s:,.0f} | "
              f"{efficiency:.2f} | {versus_tf} |")


if __name__ == "__main__":
    app.run(main)
