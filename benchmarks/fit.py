"""model.fit throughput: tfdist.MirroredStrategy vs tf.distribute's, same run.

    python benchmarks/fit.py --workload=throughput [--devices=4] [--repeats=5]
    python benchmarks/fit.py --workload=latency

Two workloads from the MirroredStrategy issue, each on N logical CPUs:

- "throughput": 256 -> 4x512 -> 10 MLP, global batch 512, examples/s;
- "latency":    ~1M-parameter MLP, global batch 64, ms/step.

Every strategy's model is built first; then the timed epochs are
interleaved (strategy A, B, C, A, B, C, ...) so background load hits all of
them alike. Prints a markdown table with medians and ratios against
`tf.distribute.MirroredStrategy` (its default cross-device ops).

One workload per process: two of TF's default MirroredStrategy instances
(CollectiveAllReduce) training different models in one process collide on
collective instance keys ("Shape mismatch in the collective instance").
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from absl import app
from absl import flags
import numpy as np

import tfdist

_DEVICES = flags.DEFINE_integer("devices", 4, "Logical CPUs.", lower_bound=2)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed epochs per strategy.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per timed epoch.", lower_bound=2)
_WORKLOAD = flags.DEFINE_enum(
    "workload", "throughput", ["throughput", "latency"], "Which workload.")

WORKLOADS = {
    # name: (layer widths after the input, input width, global batch)
    "throughput": ((512, 512, 512, 512, 10), 256, 512),
    "latency": ((1024, 512, 256, 10), 256, 64),
}


def strategies(devices: Sequence[str]) -> dict[str, Callable[[], object]]:
    import tensorflow as tf

    return {
        "single_device": lambda: tf.distribute.OneDeviceStrategy(devices[0]),
        "tf.MirroredStrategy": lambda: tf.distribute.MirroredStrategy(list(devices)),
        "tfdist auto": lambda: tfdist.MirroredStrategy(devices, all_reduce="auto"),
        "tfdist ring": lambda: tfdist.MirroredStrategy(devices, all_reduce="ring"),
        "tfdist tree": lambda: tfdist.MirroredStrategy(devices, all_reduce="tree"),
        "tfdist reduce_to_one": lambda: tfdist.MirroredStrategy(
            devices, all_reduce="reduce_to_one"),
    }


def run_workload(name: str, devices: Sequence[str], repeats: int, steps: int) -> dict[str, float]:
    import tensorflow as tf
    from tensorflow import keras

    widths, input_width, batch = WORKLOADS[name]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * steps, input_width)).astype("float32")
    y = rng.integers(0, 10, batch * steps).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        batch, drop_remainder=True).cache()
    models = {}
    for label, make in strategies(devices).items():
        with make().scope():
            model = keras.Sequential(
                [keras.Input((input_width,))]
                + [keras.layers.Dense(w, activation="relu") for w in widths[:-1]]
                + [keras.layers.Dense(widths[-1])])
            model.compile(optimizer=keras.optimizers.SGD(0.01),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(dataset, epochs=1, verbose=0)  # Trace and warm up.
        models[label] = model
    times: dict[str, list[float]] = {label: [] for label in models}
    for _ in range(repeats):
        for label, model in models.items():
            start = time.perf_counter()
            model.fit(dataset, epochs=1, verbose=0)
            times[label].append((time.perf_counter() - start) / steps)
    return {label: statistics.median(t) for label, t in times.items()}


def main(argv: Sequence[str]) -> None:
    del argv
    devices = tfdist.simulate_cpu_devices(_DEVICES.value)
    for name in [_WORKLOAD.value]:
        widths, input_width, batch = WORKLOADS[name]
        step_s = run_workload(name, devices, _REPEATS.value, _STEPS.value)
        base = step_s["tf.MirroredStrategy"]
        print(f"\n### {name}: MLP {input_width}->{'->'.join(map(str, widths))}, "
              f"global batch {batch}, {len(devices)} logical CPUs\n")
        print("| strategy | ms/step | examples/s | speed vs tf.MirroredStrategy |")
        print("|---|---|---|---|")
        for label, seconds in step_s.items():
            print(f"| {label} | {seconds * 1e3:.1f} | {batch / seconds:,.0f} | "
                  f"{base / seconds:.2f}x |")


if __name__ == "__main__":
    app.run(main)
