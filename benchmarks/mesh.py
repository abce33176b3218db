"""MeshStrategy through `fit`: tensor parallel and hybrid meshes against one device and data parallel.

    python benchmarks/mesh.py --workload=mlp          # Megatron's MLP, compute-bound
    python benchmarks/mesh.py --workload=transformer  # examples/transformer.py's model

Every contender trains the same Keras 3 model with `fit` on the same data,
in a process of its own with the same threads: 2 logical CPUs with one
intra-op thread each (one core per device, as if each were a device of its
own: a split can use both cores where one device uses one; the ideal
speed-up is 2x) and 3 inter-op threads. Contenders:

- `one device`: no strategy, free to use both cores (its independent ops, such
  as two gradients' matrix products or Adam's per-variable updates, can run on
  two inter-op threads at once);
- `one device, one core`: the same, pinned to one core (`sched_setaffinity`):
  a device of its own, as each logical CPU of the other contenders stands for
  one, so a 2-way split's ideal is 2x against it;
- `TF MirroredStrategy`: TF's built-in data parallelism over the 2 CPUs
  (TF has no built-in tensor parallelism for `fit` to compare with);
- `data parallel`: `tfdist.MirroredStrategy` over the 2 CPUs;
- `mesh 2x1`: `tfdist.MeshStrategy` with the batch split 2 ways, every
  weight whole (data parallelism by DTensor);
- `mesh 1x2`: the same with every large layer split 2 ways (automatic
  layouts: Megatron's), each batch whole on both devices.

Each prints its median time per step and the cores it kept busy (process CPU
time over wall time in the timed epochs; a single-core step shows ~1.0) over `--repeats` timed epochs of
`--steps_per_epoch` steps (after `--warmup_epochs` untimed epochs: the first traces, and a
mesh's second still ran up to 1.7x slower than its third in a diagnostic) and the bytes of
variables (weights, optimizer slots) the busiest device holds. A contender
the strategy refuses is reported with its error.

Workloads:
- `mlp`: Dense(width) -> Dense(4 width, relu) -> Dense(width) -> Dense(10),
  batch 256, Adam (`--optimizer=sgd`: SGD); width 1024 by default: most of a step is the two large
  matrix products that a 1x2 mesh splits.
- `transformer`: examples/transformer.py's keras-io model (token and
  position embedding, one transformer block of 4 heads, feed-forward 64,
  mean over time, two Dense), batch 64, sequences of 64 tokens.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

_WORKLOAD = flags.DEFINE_enum("workload", "mlp", ["mlp", "transformer"], "What to train.")
_WIDTH = flags.DEFINE_integer("width", 1024, "mlp: the block's input and output width (hidden: 4x).")
_OPTIMIZER = flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"], "mlp: the optimizer.")
_STEPS = flags.DEFINE_integer("steps_per_epoch", 10, "Timed steps per epoch.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed epochs per run (the median step is kept).")
_WARMUP_EPOCHS = flags.DEFINE_integer("warmup_epochs", 2, "Untimed epochs first.", lower_bound=1)
_ROUNDS = flags.DEFINE_integer(
    "rounds", 3, "Runs of every contender, in turns (the median and the range are reported).")
_CONTENDER = flags.DEFINE_enum(
    "contender", None, ["one_device", "one_device_1core", "tf_mirrored", "data_parallel", "mesh_2x1",
                        "mesh_1x2"],
    "Internal: run one contender in this process and print JSON.")

CONTENDERS = {
    "one_device": "one device (both cores free)",
    "one_device_1core": "one device, one core",
    "tf_mirrored": "TF MirroredStrategy (built-in)",
    "data_parallel": "data parallel (tfdist.MirroredStrategy)",
    "mesh_2x1": "mesh 2x1 (batch split)",
    "mesh_1x2": "mesh 1x2 (layers split)",
}
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mlp(keras, width: int):
    model = keras.Sequential([
        keras.Input((width,)),
        keras.layers.Dense(4 * width, activation="relu", name="up"),
        keras.layers.Dense(width, name="down"),
        keras.layers.Dense(10, name="head"),
    ])
    model.compile(optimizer=_OPTIMIZER.value,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _workload(np, keras):
    """(build_model, x, y, batch_size)."""
    steps = _STEPS.value
    rng = np.random.default_rng(0)
    if _WORKLOAD.value == "mlp":
        batch = 256
        x = rng.normal(size=(batch * steps, _WIDTH.value)).astype("float32")
        y = rng.integers(0, 10, batch * steps).astype("int32")
        return (lambda: _mlp(keras, _WIDTH.value)), x, y, batch
    sys.path.insert(0, os.path.join(_ROOT, "examples"))
    import transformer  # noqa: PLC0415 - examples/transformer.py

    batch = 64
    config = transformer.TrainConfig(num_examples=2 * batch * steps)
    (x, y), _ = transformer.load_data(config)  # 80% of them: more than batch * steps.
    return (lambda: transformer.build_model(config)), x[: batch * steps], y[: batch * steps], batch


def _run_contender(name: str) -> dict:
    if name == "one_device_1core":  # Before TensorFlow starts its threads.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tfdist  # noqa: PLC0415

    tfdist.simulate_cpu_devices(2)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(3)
    keras = tf.keras
    build, x, y, batch = _workload(np, keras)
    strategy = {
        "one_device": tf.distribute.get_strategy,
        "one_device_1core": tf.distribute.get_strategy,
        "tf_mirrored": tf.distribute.MirroredStrategy,
        "data_parallel": tfdist.MirroredStrategy,
        "mesh_2x1": lambda: tfdist.MeshStrategy({"batch": 2, "model": 1}, layout_map=None),
        "mesh_1x2": lambda: tfdist.MeshStrategy({"batch": 1, "model": 2}, layout_map=None),
    }[name]()

    class Clock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds, self.cores = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)
            self.cores.append((time.process_time() - self.cpu_start) / self.seconds[-1])

    try:
        with strategy.scope():
            model = build()
        clock = Clock()
        # Batches made once and kept: the step, not the input pipeline, is measured.
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache()
        model.fit(dataset, epochs=_WARMUP_EPOCHS.value + _REPEATS.value, verbose=0, callbacks=[clock])
    except Exception as e:  # noqa: BLE001 - reported as the contender's result.
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    if isinstance(strategy, tfdist.MeshStrategy):
        held, _ = strategy.bytes_per_device()
    else:  # Every device holds every variable.
        held = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                   for v in model.weights + model.optimizer.variables)
    timed = slice(_WARMUP_EPOCHS.value, None)
    return {"step_s": statistics.median(clock.seconds[timed]) / _STEPS.value,
            "cores": statistics.median(clock.cores[timed]), "bytes": held}


def main(argv):
    del argv
    if _CONTENDER.value:
        print(json.dumps(_run_contender(_CONTENDER.value)))
        return
    runs: dict[str, list[dict]] = {name: [] for name in CONTENDERS}
    for _ in range(_ROUNDS.value):  # In turns: the host's speed drifts.
        for name in CONTENDERS:
            output = subprocess.run(
                [sys.executable, __file__, f"--contender={name}"] + sys.argv[1:],
                check=True, capture_output=True, text=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "0"},
            ).stdout
            runs[name].append(json.loads(output.strip().splitlines()[-1]))
    base = statistics.median(run["step_s"] for run in runs["one_device_1core"])
    free_base = statistics.median(run["step_s"] for run in runs["one_device"])
    tf_base = statistics.median(run["step_s"] for run in runs["tf_mirrored"])
    print(f"Command: python benchmarks/mesh.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"Workload {_WORKLOAD.value}; 2 logical CPUs (1 intra-op thread each, 3 inter-op threads); "
          f"{_ROUNDS.value} runs of each, each the median of {_REPEATS.value} epochs of "
          f"{_STEPS.value} steps\n")
    print("| contender | step (ms), median [range] | cores busy | vs one device, one core "
          "| vs one device, both cores free | vs TF MirroredStrategy | bytes per device (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in runs.items():
        if "error" in rows[0]:
            print(f"| {CONTENDERS[name]} | refused: {rows[0]['error']} | | | | | |")
            continue
        steps = sorted(row["step_s"] * 1e3 for row in rows)
        median = statistics.median(steps)
        cores = statistics.median(row["cores"] for row in rows)
        print(f"| {CONTENDERS[name]} | {median:.1f} [{steps[0]:.1f}-{steps[-1]:.1f}] | {cores:.2f} | "
              f"{base * 1e3 / median:.2f}x | {free_base * 1e3 / median:.2f}x | "
              f"{tf_base * 1e3 / median:.2f}x | {rows[0]['bytes'] / 2**20:.1f} |")


if __name__ == "__main__":
    app.run(main)
