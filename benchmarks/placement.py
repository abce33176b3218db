"""Pipeline efficiency of tfdist.LayerPlacementStrategy on logical-CPU stages.

    python benchmarks/placement.py [--num_stages=2,4] [--num_microbatches=1,2,4,8]
        [--layers_per_stage=2] [--width=1024] [--global_batch_size=256]
        [--steps=10] [--repeats=3]

A compute-heavy stack of `num_stages * layers_per_stage` Dense(width, relu)
layers (equal layers, so the params-balanced plan is even) trained with
SGD through `model.fit` on S logical CPUs, one intra-op thread each (the
inter-op pool has S + 1 threads, so S stages can run at once). For each S
and M: the median step time over `repeats` timed epochs of `steps` steps
(after an epoch that traces; all contenders of one S alternate within each
repeat, so background load hits them alike), the speed-up over the first M
listed (M = 1 by default) on the same stages, and GPipe's ideal
S·M / (M + S − 1) (`tfdist.placement.ideal_speedup`, relative to the same
first M), whose ratio is the pipeline efficiency. The same model on one
device without a strategy (same threads) is the baseline of the last
column.

A speed-up needs S free cores: on a machine with fewer, or with other
load, the stages share cores and the figures say so. Prints a markdown
table and the exact command.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags

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
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per timed epoch.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed epochs per case.", lower_bound=1)


def _epoch_s(model, dataset, steps: int) -> float:
    """Seconds of one `fit` epoch of `steps` steps (Keras's loop included)."""
    start = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    return time.perf_counter() - start


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
    tf.config.threading.set_inter_op_parallelism_threads(max(stage_counts) + 1)
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
        # Contenders alternate within each repeat, so background load
        # hits all alike; the median repeat counts.
        times: dict[object, list[float]] = {name: [] for name in contenders}
        for _ in range(_REPEATS.value):
            for name, model in contenders.items():
                times[name].append(_epoch_s(model, dataset, _STEPS.value) / _STEPS.value)
        step_s = {name: statistics.median(t) for name, t in times.items()}
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
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n| stages S | microbatches M | step (ms) | speed-up over first M | GPipe ideal "
          "S·M/(M+S−1) | efficiency | speed-up over one device |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\ncommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    app.run(main)
