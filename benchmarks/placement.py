"""Pipeline efficiency of tfdist.LayerPlacementStrategy on logical-CPU stages.

    python benchmarks/placement.py [--num_stages=2,4] [--num_microbatches=1,2,4,8]
        [--layers_per_stage=2] [--width=1024] [--global_batch_size=256]
        [--steps=10] [--repeats=3]

A compute-heavy stack of `num_stages * layers_per_stage` Dense(width, relu)
layers (equal layers, so the params-balanced plan is even) trained with
SGD through `model.fit` on S logical CPUs, one intra-op thread each (the
inter-op pool has S + 1 threads, so S stages can run at once, but no more
than the machine has cores). For each S
and M: the median step time over `repeats` timed epochs of `steps` steps
(timed from the first step's start to the last step's end, after an epoch
that traces; all contenders of one S alternate within each
repeat, so background load hits them alike), the speed-up over the first M
listed (M = 1 by default) on the same stages, and GPipe's ideal
S·M / (M + S − 1) (`tfdist.placement.ideal_speedup`, relative to the same
first M), whose ratio is the pipeline efficiency. The same model on one
device without a strategy (same threads) is the baseline of the last
column.

A speed-up needs S free cores: on a machine with fewer, or with other
load, the stages share cores and the figures say so. Prints a markdown
table and the exact command.

    TF_CPU_ALLOCATOR_USE_BFC=true python benchmarks/placement.py --workload=rematerialize

The memory effect of `rematerialize=True`: S blocks, each a Sequential of
`layers_per_stage` Dense(width, relu) layers (a top-level layer whose
inner activations rematerialization drops), trained with and without it;
the peak bytes the CPU allocator held during `steps` steps after the
first (TF reports them only with its BFC allocator on CPU, hence the
variable; all logical CPUs share that one allocator), and the step time.

    python benchmarks/placement.py --workload=balance --num_stages=2

The balanced plan against an equal-layer-count `{layer: device}` map on
an unbalanced stack (S layers of `width` units, then 3S of width/4): the
step time through `fit`, and the slowest stage's time (forward and
backward of one microbatch on its device, from `placement_report()`),
which bounds the pipelined step where each stage has a device of its
own. Logical CPUs share one thread pool, so there any stage's ops run on
any free core and the step time hardly depends on the plan.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags

_WORKLOAD = flags.DEFINE_enum(
    "workload", "pipeline", ["pipeline", "rematerialize", "balance"],
    "pipeline: speed-up over M vs GPipe's ideal; rematerialize: peak memory "
    "and step time with and without rematerialize=True; balance: the balanced "
    "plan against an equal-layer-count split of an unbalanced model.",
)
_NUM_STAGES = flags.DEFINE_list("num_stages", ["2", "4"], "Stage counts S.")
_NUM_MICROBATCHES = flags.DEFINE_list(
    "num_microbatches", ["1", "2", "4", "8"], "Microbatch counts M."
)
_LAYERS_PER_STAGE = flags.DEFINE_integer(
    "layers_per_stage", 2, "Dense layers per stage.", lower_bound=1
)
_WIDTH = flags.DEFINE_integer("width", 1024, "Units of each Dense layer.", lower_bound=1)
_GLOBAL_BATCH_SIZE = flags.DEFINE_integer(
    "global_batch_size", 256, "Rows per step (split into M microbatches).", lower_bound=1
)
_INTER_OP_THREADS = flags.DEFINE_integer(
    "inter_op_threads", 0,
    "TF's inter-op threads; 0: S + 1 for the largest S, at most the machine's "
    "cores (more threads than cores time-slice the stages' matrix products).",
    lower_bound=0,
)
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per timed epoch.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed epochs per case.", lower_bound=1)


def _epoch_s(model, dataset, steps: int) -> float:
    """Seconds of the `steps` steps of one `fit` epoch, Keras's loop included.

    From the start of the first step to the end of the last (each step's
    function returns when it is done): not `fit`'s set-up and teardown.
    Destroying the epoch's tf.data iterator waits for tf.data's autotuning
    thread, 0.2 s to 2 s at random on this VM, one device too, which would
    swamp a short epoch of steps.
    """
    import tensorflow as tf  # noqa: PLC0415

    marks: list[float] = []

    class StepClock(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                marks.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            if batch == steps - 1:
                marks.append(time.perf_counter())

    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[StepClock()])
    return marks[1] - marks[0]


def _median_step_s(models: dict, dataset) -> dict:
    """Per model (already traced), its median step over `repeats` timed epochs.

    Models alternate within each repeat, so background load hits all alike.
    """
    times: dict[object, list[float]] = {key: [] for key in models}
    for _ in range(_REPEATS.value):
        for key, model in models.items():
            times[key].append(_epoch_s(model, dataset, _STEPS.value) / _STEPS.value)
    return {key: statistics.median(t) for key, t in times.items()}


def _print_table(columns: Sequence[str], rows: Sequence[str]) -> None:
    """The load after the run, a markdown table of `rows`, the command."""
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    print("\n".join(rows))
    print("\ncommand: python " + " ".join(sys.argv))


def _rematerialize(stage_counts, microbatch_counts, dataset) -> None:
    import tensorflow as tf  # noqa: PLC0415
    import tfdist  # noqa: PLC0415

    width, steps = _WIDTH.value, _STEPS.value
    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError as e:
        raise app.UsageError(
            "peak memory on CPU needs TF's BFC allocator: run with "
            "TF_CPU_ALLOCATOR_USE_BFC=true in the environment"
        ) from e

    def build(num_blocks: int):
        tf.keras.utils.set_random_seed(0)
        blocks = [
            tf.keras.Sequential(
                [tf.keras.layers.Dense(width, activation="relu")
                 for _ in range(_LAYERS_PER_STAGE.value)],
                name=f"block{i}",
            )
            for i in range(num_blocks)
        ]
        model = tf.keras.Sequential([tf.keras.Input((width,)), *blocks])
        model.compile(optimizer=tf.keras.optimizers.SGD(1e-4), loss="mse")
        return model

    rows = []
    for stages in stage_counts:
        for m in microbatch_counts:
            peaks, times = {}, {}
            for rematerialize in (False, True):
                strategy = tfdist.LayerPlacementStrategy(
                    [f"/cpu:{i}" for i in range(stages)],
                    num_microbatches=m,
                    rematerialize=rematerialize,
                )
                with strategy.scope():
                    model = build(stages)
                _epoch_s(model, dataset, 1)  # Traces, places.
                tf.config.experimental.reset_memory_stats("CPU:0")
                held = tf.config.experimental.get_memory_info("CPU:0")["current"]
                times[rematerialize] = _epoch_s(model, dataset, steps) / steps
                peaks[rematerialize] = (
                    tf.config.experimental.get_memory_info("CPU:0")["peak"] - held
                )
            rows.append(
                f"| {stages} | {m} | {peaks[False] / 2**20:.1f} | {peaks[True] / 2**20:.1f} "
                f"| {peaks[True] / peaks[False]:.2f} | {1e3 * times[False]:.1f} "
                f"| {1e3 * times[True]:.1f} | {times[True] / times[False]:.2f} |"
            )
            print(rows[-1], flush=True)
    _print_table(
        ("stages S", "microbatches M", "step peak (MiB)", "with rematerialize", "ratio",
         "step (ms)", "with rematerialize", "ratio"),
        rows,
    )


def _balance(stage_counts, microbatch_counts) -> None:
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    import tfdist  # noqa: PLC0415

    width, batch = _WIDTH.value, _GLOBAL_BATCH_SIZE.value
    light = max(1, width // 4)
    rng = np.random.default_rng(0)
    dataset = tf.data.Dataset.from_tensors((
        rng.normal(size=(batch, width)).astype("float32"),
        rng.normal(size=(batch, light)).astype("float32"),
    )).repeat()

    def build(stages: int):
        tf.keras.utils.set_random_seed(0)
        widths = [width] * stages + [light] * (3 * stages)
        model = tf.keras.Sequential(
            [tf.keras.Input((width,))]
            + [tf.keras.layers.Dense(w, activation="relu", name=f"dense_{i}")
               for i, w in enumerate(widths)]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(1e-4), loss="mse")
        return model

    rows = []
    for stages in stage_counts:
        devices = [f"/cpu:{i}" for i in range(stages)]
        naive = {f"dense_{i}": devices[i // 4] for i in range(4 * stages)}
        models, shares, bottleneck_s = {}, {}, {}
        for m in microbatch_counts:
            for plan, placement in (("naive", naive), ("balanced", "balanced")):
                strategy = tfdist.LayerPlacementStrategy(
                    devices, placement, num_microbatches=m
                )
                with strategy.scope():
                    models[plan, m] = model = build(stages)
                _epoch_s(model, dataset, 2)  # Traces, places.
                params = [stage.params for stage in strategy.placement_plan(model).stages]
                shares[plan] = max(params) / sum(params)
                bottleneck_s[plan, m] = max(strategy.placement_report(model).stage_times_s)
        step_s = _median_step_s(models, dataset)
        for m in microbatch_counts:
            rows.append(
                f"| {stages} | {m} | {1e3 * step_s['naive', m]:.1f} "
                f"| {100 * shares['naive']:.0f} % | {1e3 * step_s['balanced', m]:.1f} "
                f"| {100 * shares['balanced']:.0f} % "
                f"| {step_s['naive', m] / step_s['balanced', m]:.2f} "
                f"| {1e3 * bottleneck_s['naive', m]:.1f} | {1e3 * bottleneck_s['balanced', m]:.1f} "
                f"| {bottleneck_s['naive', m] / bottleneck_s['balanced', m]:.2f} |"
            )
            print(rows[-1], flush=True)
    _print_table(
        ("stages S", "microbatches M", "naive split step (ms)", "weights on its busiest stage",
         "balanced step (ms)", "weights on its busiest stage", "balanced speed-up",
         "naive slowest stage (ms)", "balanced slowest stage (ms)", "ratio"),
        rows,
    )


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    stage_counts = [int(s) for s in _NUM_STAGES.value]
    microbatch_counts = [int(m) for m in _NUM_MICROBATCHES.value]
    import tfdist  # noqa: PLC0415 - flags first, TensorFlow after.

    tfdist.simulate_cpu_devices(max(stage_counts))
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(
        _INTER_OP_THREADS.value or min(max(stage_counts) + 1, os.cpu_count() or 1)
    )
    width, batch = _WIDTH.value, _GLOBAL_BATCH_SIZE.value
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, width)).astype("float32")
    y = rng.normal(size=(batch, width)).astype("float32")
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()

    def build(num_layers: int):
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential(
            [tf.keras.Input((width,))]
            + [tf.keras.layers.Dense(width, activation="relu") for _ in range(num_layers)]
        )
        model.compile(optimizer=tf.keras.optimizers.SGD(1e-4), loss="mse")
        return model

    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    if _WORKLOAD.value == "rematerialize":
        _rematerialize(stage_counts, microbatch_counts, dataset)
        return
    if _WORKLOAD.value == "balance":
        _balance(stage_counts, microbatch_counts)
        return
    rows = []
    for stages in stage_counts:
        num_layers = stages * _LAYERS_PER_STAGE.value
        contenders = {"one device": build(num_layers)}
        for m in microbatch_counts:
            strategy = tfdist.LayerPlacementStrategy(
                [f"/cpu:{i}" for i in range(stages)], num_microbatches=m
            )
            with strategy.scope():
                contenders[m] = build(num_layers)
        for model in contenders.values():
            _epoch_s(model, dataset, 2)  # Traces, places.
        step_s = _median_step_s(contenders, dataset)
        base = step_s[microbatch_counts[0]]
        for m in microbatch_counts:
            speedup = base / step_s[m]
            ideal = tfdist.placement.ideal_speedup(stages, m) / tfdist.placement.ideal_speedup(
                stages, microbatch_counts[0]
            )
            rows.append(
                f"| {stages} | {m} | {1e3 * step_s[m]:.1f} | {speedup:.2f} | {ideal:.2f} "
                f"| {100 * speedup / ideal:.0f} % | {step_s['one device'] / step_s[m]:.2f} |"
            )
            print(rows[-1], flush=True)
    _print_table(
        ("stages S", "microbatches M", "step (ms)", "speed-up over first M",
         "GPipe ideal S·M/(M+S−1)", "efficiency", "speed-up over one device"),
        rows,
    )


if __name__ == "__main__":
    app.run(main)
