"""model.fit speed: tfdist.MirroredStrategy vs tf.distribute's, same run.

    python benchmarks/fit.py --workload=throughput [--mode=processes]
    python benchmarks/fit.py --workload=latency --mode=same_process
    python benchmarks/fit.py --workload=epochs

Three workloads on N logical CPUs:

- "throughput": 256 -> 4x512 -> 10 MLP, global batch 512, examples/s;
- "latency":    ~1M-parameter MLP, global batch 64, ms/step;
- "epochs":     the throughput MLP on a shuffled pipeline
  (`from_tensor_slices(...).shuffle(N).batch(512)`, 30 steps per epoch),
  whole epochs as a user sees them: the first step and first epoch
  (tracing, calibration), then per later epoch its set-up (the time from
  `on_epoch_begin` to the end of its first step, less a median step) and
  its throughput over the whole epoch. Each contender in its own process,
  with and without tfdist's calibration cache.

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
    "workload", "throughput", ["throughput", "latency", "epochs"], "Which workload.")
_EPOCHS = flags.DEFINE_integer(
    "epochs", 5, "epochs workload: epochs per fit (the first reported apart).", lower_bound=2)
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
    "epochs": ((512, 512, 512, 512, 10), 256, 512),
}
#: Steps per epoch of the "epochs" workload.
EPOCH_STEPS = 30
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


def epoch_clock():
    """A Keras callback stamping epoch begins, step ends and epoch ends."""
    from tensorflow import keras

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append([time.perf_counter()])

        def on_train_batch_end(self, batch, logs=None):
            self.epochs[-1].append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.epochs[-1].append(time.perf_counter())

    return EpochClock()


def run_epochs(name: str, make_strategy: Callable[[], object], epochs: int) -> dict[str, float]:
    """One fit of the "epochs" workload from a cold start; its figures."""
    import tensorflow as tf
    from tensorflow import keras

    widths, input_width, batch = WORKLOADS["epochs"]
    rng = np.random.default_rng(0)
    num_examples = batch * EPOCH_STEPS
    x = rng.normal(size=(num_examples, input_width)).astype("float32")
    y = rng.integers(0, 10, num_examples).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(num_examples).batch(batch)
    with make_strategy().scope():
        model = keras.Sequential(
            [keras.Input((input_width,))]
            + [keras.layers.Dense(w, activation="relu") for w in widths[:-1]]
            + [keras.layers.Dense(widths[-1])])
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    clock = epoch_clock()
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[clock])
    first, later = clock.epochs[0], clock.epochs[1:]
    steps = [np.diff(e[1:-1]) for e in later]
    median_step = float(np.median(np.concatenate(steps)))
    return {
        "first_step_s": first[1] - first[0],
        "first_epoch_s": first[-1] - first[0],
        "median_step_s": median_step,
        "setup_s": float(np.median([e[1] - e[0] - median_step for e in later])),
        "examples_per_s": float(np.median([num_examples / (e[-1] - e[0]) for e in later])),
    }


def run_one_contender(name: str) -> None:
    """--contender mode: one contender, `rounds` timed fits, JSON on stdout."""
    import tfdist

    devices = tfdist.simulate_cpu_devices(_DEVICES.value)
    if _WORKLOAD.value == "epochs":
        print("RESULT " + json.dumps(run_epochs(name, contenders(devices)[name], _EPOCHS.value)), flush=True)
        return
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


EPOCH_CONTENDERS = ("one device, no strategy", BASELINE, "tfdist auto")


def run_epoch_workload() -> None:
    """The "epochs" workload: each contender in a fresh process, per round.

    tfdist runs twice per round: with an empty calibration cache (as a
    machine's first run) and with the cache its cold run left.
    """
    import shutil

    from tfdist.collectives import calibration_cache

    results: dict[str, list[dict[str, float]]] = {}
    for _ in range(_ROUNDS.value):
        for name in EPOCH_CONTENDERS + ("tfdist auto (cached calibration)",):
            if name == "tfdist auto":
                shutil.rmtree(calibration_cache.DEFAULT_DIRECTORY, ignore_errors=True)
            contender = name.replace(" (cached calibration)", "")
            command = [sys.executable, os.path.abspath(__file__),
                       f"--contender={contender}", "--workload=epochs",
                       f"--devices={_DEVICES.value}", f"--epochs={_EPOCHS.value}"]
            output = subprocess.run(command, capture_output=True, text=True, check=True)
            line = next(l for l in output.stdout.splitlines() if l.startswith("RESULT "))
            results.setdefault(name, []).append(json.loads(line[len("RESULT "):]))
    median = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in results.items()}
    base = median["one device, no strategy"]
    tf_first = median[BASELINE]["first_step_s"]
    print(f"\n### epochs: MLP 256->4x512->10, global batch 512, shuffled pipeline, "
          f"{EPOCH_STEPS} steps/epoch, {_EPOCHS.value} epochs, {_DEVICES.value} logical CPUs, "
          f"each contender in its own process, median of {_ROUNDS.value} rounds\n")
    print("| contender | first step (s) | first step vs TF's | first epoch (s) | later epochs: set-up (ms) "
          "| set-up vs one device (ms) | median step (ms) | whole-epoch examples/s | vs one device |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m in median.items():
        print(f"| {name} | {m['first_step_s']:.2f} | {m['first_step_s'] / tf_first:.2f}x | "
              f"{m['first_epoch_s']:.2f} | {m['setup_s'] * 1e3:.0f} | "
              f"{(m['setup_s'] - base['setup_s']) * 1e3:+.0f} | {m['median_step_s'] * 1e3:.1f} | "
              f"{m['examples_per_s']:,.0f} | {m['examples_per_s'] / base['examples_per_s']:.2f}x |")


def main(argv: Sequence[str]) -> None:
    del argv
    if _CONTENDER.value:
        run_one_contender(_CONTENDER.value)
        return
    if _WORKLOAD.value == "epochs":
        run_epoch_workload()
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
