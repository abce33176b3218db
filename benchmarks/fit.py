"""model.fit speed: tfdist.MirroredStrategy vs tf.distribute's, same run.

    python benchmarks/fit.py --workload=throughput [--mode=processes]
    python benchmarks/fit.py --workload=latency --mode=same_process

Two workloads from the MirroredStrategy issue, on N logical CPUs:

- "throughput": 256 -> 4x512 -> 10 MLP, global batch 512, examples/s;
- "latency":    ~1M-parameter MLP, global batch 64, ms/step.

Every contender trains the same model on the same in-memory data through
`model.fit`; a callback stamps the end of every step, and the steady-state
step time is the median step after `--warmup_steps` of each `fit` call.
Contenders run in rounds (A, B, C, A, B, C, ...) so background load hits
all of them alike; the table has medians over rounds, ratios against
`tf.distribute.MirroredStrategy`, and minor page faults per step.

Modes:

- `processes` (default): every contender in a fresh process, as a user
  runs one or the other. TF's MirroredStrategy prefetches input through a
  `MultiDeviceIterator`, whose per-device GeneratorDatasets make TensorFlow
  set glibc's M_TRIM_THRESHOLD (logged as "Memory patch applied"); from
  then on the process's allocator returns large buffers to the kernel and
  faults them in again, every step. tfdist's host-memory input path
  creates no GeneratorDataset.
- `same_process`: all contenders in one process (so TF's allocator setting
  applies to all of them). With `--reset_malloc`, glibc's thresholds are set
  back after the first TF contender ran, which isolates the difference
  between the strategies' graphs (a diagnostic, not a user setting).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from absl import app
from absl import flags
import numpy as np

_DEVICES = flags.DEFINE_integer("devices", 4, "Logical CPUs.", lower_bound=2)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Timed fits per contender.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 40, "Steps per timed fit.", lower_bound=4)
_WARMUP_STEPS = flags.DEFINE_integer(
    "warmup_steps", 5, "Steps of each fit left out of the median.", lower_bound=1)
_WORKLOAD = flags.DEFINE_enum(
    "workload", "throughput", ["throughput", "latency"], "Which workload.")
_MODE = flags.DEFINE_enum(
    "mode", "processes", ["processes", "same_process"], "See the module docstring.")
_RESET_MALLOC = flags.DEFINE_boolean(
    "reset_malloc", False, "same_process only: undo TF's glibc setting.")
_CONTENDER = flags.DEFINE_string(
    "contender", None, "Internal: run one contender in this process, print JSON.")

WORKLOADS = {
    # name: (layer widths after the input, input width, global batch)
    "throughput": ((512, 512, 512, 512, 10), 256, 512),
    "latency": ((1024, 512, 256, 10), 256, 64),
}
BASELINE = "tf.MirroredStrategy"


def contenders(devices: Sequence[str]) -> dict[str, Callable[[], object]]:
    import tensorflow as tf

    import tfdist

    def tfdist_strategy(algorithm: str) -> Callable[[], object]:
        return lambda: tfdist.MirroredStrategy(devices, all_reduce=algorithm)

    return {
        "one device, no strategy": tf.distribute.get_strategy,
        BASELINE: lambda: tf.distribute.MirroredStrategy(list(devices)),
        "tfdist auto": tfdist_strategy("auto"),
        "tfdist ring": tfdist_strategy("ring"),
        "tfdist tree": tfdist_strategy("tree"),
        "tfdist reduce_to_one": tfdist_strategy("reduce_to_one"),
    }


def step_clock():
    """A Keras callback recording the end time of every training step."""
    from tensorflow import keras

    class StepClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.stamps = [time.perf_counter()]

        def on_train_batch_end(self, batch, logs=None):
            self.stamps.append(time.perf_counter())

    return StepClock()


def build(name: str, make_strategy: Callable[[], object], workload: str):
    """Returns a compiled, warmed-up model and its dataset."""
    import tensorflow as tf
    from tensorflow import keras

    widths, input_width, batch = WORKLOADS[workload]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch * 16, input_width)).astype("float32")
    y = rng.integers(0, 10, batch * 16).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        batch, drop_remainder=True).cache().repeat()
    with make_strategy().scope():
        model = keras.Sequential(
            [keras.Input((input_width,))]
            + [keras.layers.Dense(w, activation="relu") for w in widths[:-1]]
            + [keras.layers.Dense(widths[-1])])
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)  # Trace, warm up.
    return model, dataset


def timed_fit(model, dataset, steps: int, warmup_steps: int) -> tuple[float, float]:
    """(median steady-state seconds per step, minor page faults per step)."""
    clock = step_clock()
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[clock])
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    step_s = np.diff(clock.stamps)[warmup_steps:]
    return float(np.median(step_s)), faults / steps


def reset_malloc() -> None:
    """Sets glibc's mmap/trim thresholds back to sizes that keep buffers."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 << 20)
    libc.mallopt(m_trim_threshold, 64 << 20)


def run_one_contender(name: str) -> None:
    """--contender mode: one contender, `rounds` timed fits, JSON on stdout."""
    import tfdist

    devices = tfdist.simulate_cpu_devices(_DEVICES.value)
    model, dataset = build(name, contenders(devices)[name], _WORKLOAD.value)
    results = [timed_fit(model, dataset, _STEPS.value, _WARMUP_STEPS.value)
               for _ in range(_ROUNDS.value)]
    print("RESULT " + json.dumps(results), flush=True)


def in_processes(names: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    """Each round, each contender in a fresh process (one timed fit each)."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for _ in range(_ROUNDS.value):
        for name in names:
            command = [sys.executable, os.path.abspath(__file__),
                       f"--contender={name}", f"--workload={_WORKLOAD.value}",
                       f"--devices={_DEVICES.value}", "--rounds=1",
                       f"--steps={_STEPS.value}", f"--warmup_steps={_WARMUP_STEPS.value}"]
            output = subprocess.run(command, capture_output=True, text=True, check=True)
            line = next(l for l in output.stdout.splitlines() if l.startswith("RESULT "))
            results[name].extend(tuple(r) for r in json.loads(line[len("RESULT "):]))
    return results


def in_one_process(names: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    """Every contender built in this process; timed fits alternate."""
    import tfdist

    devices = tfdist.simulate_cpu_devices(_DEVICES.value)
    makers = contenders(devices)
    built = {name: build(name, makers[name], _WORKLOAD.value) for name in names}
    if _RESET_MALLOC.value:
        reset_malloc()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for _ in range(_ROUNDS.value):
        for name, (model, dataset) in built.items():
            results[name].append(
                timed_fit(model, dataset, _STEPS.value, _WARMUP_STEPS.value))
    return results


def main(argv: Sequence[str]) -> None:
    del argv
    if _CONTENDER.value:
        run_one_contender(_CONTENDER.value)
        return
    names = list(contenders(tuple(f"/cpu:{i}" for i in range(_DEVICES.value))))
    measure = in_processes if _MODE.value == "processes" else in_one_process
    results = measure(names)
    step_s = {n: statistics.median(r[0] for r in results[n]) for n in names}
    faults = {n: statistics.median(r[1] for r in results[n]) for n in names}
    widths, input_width, batch = WORKLOADS[_WORKLOAD.value]
    mode = _MODE.value + (", malloc reset" if _RESET_MALLOC.value else "")
    print(f"\n### {_WORKLOAD.value}: MLP {input_width}->{'->'.join(map(str, widths))}, "
          f"global batch {batch}, {_DEVICES.value} logical CPUs, {mode}, "
          f"median of {_ROUNDS.value} rounds\n")
    print("| contender | ms/step | examples/s | speed vs tf.MirroredStrategy "
          "| step time vs tf.MirroredStrategy | page faults/step |")
    print("|---|---|---|---|---|---|")
    base = step_s[BASELINE]
    for name in names:
        seconds = step_s[name]
        print(f"| {name} | {seconds * 1e3:.1f} | {batch / seconds:,.0f} | "
              f"{base / seconds:.2f}x | {seconds / base:.2f}x | {faults[name]:,.0f} |")


if __name__ == "__main__":
    app.run(main)
