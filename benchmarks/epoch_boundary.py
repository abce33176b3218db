"""What an epoch boundary costs: TensorFlow alone, then tfdist's input path.

    python benchmarks/epoch_boundary.py [--epochs=14]

Keras's `fit` starts each epoch by creating a new tf.data iterator, which
drops the previous epoch's. This script does the same with TensorFlow alone:
a `tf.function` step (an MLP's forward pass) reads a 30-batch shuffled
pipeline until `OutOfRangeError`, and each epoch's set-up (`iter()`, dropping
the previous iterator, and the first step) is timed. Pipelines:

- `shuffle+batch`: `from_tensor_slices(...).shuffle(N).batch(512)`;
- `+map`, `+prefetch(AUTOTUNE)`, `+map+prefetch(AUTOTUNE)`: one stage more;
- `+map+prefetch, autotune off`: the same with `Options().autotune.enabled = False`;
- `+map+prefetch, dropped on another thread`: the iterator destroyed off
  the stepping thread, as tfdist's `DistributedDataset` does for every
  iterator it hands out (`tfdist/data/distributed/iterator_reaper.py`);
- `tfdist.MirroredStrategy input (4 replicas)`: `iter()` over tfdist's
  distributed dataset of the same pipeline (its split `map` and `prefetch`
  added), read by the same step on one replica's slice.

Each pipeline runs in a fresh process. The table has the median and the
largest set-up over the epochs after the first, and how many took over 100 ms
more than the median step.
"""

from __future__ import annotations

import json
import subprocess
import sys

from absl import app
from absl import flags
import numpy as np

_EPOCHS = flags.DEFINE_integer("epochs", 14, "Epochs per pipeline.", lower_bound=3)
_PIPELINE = flags.DEFINE_string("pipeline", None, "Run one pipeline here (internal).")

PIPELINES = (
    "shuffle+batch",
    "+map",
    "+prefetch(AUTOTUNE)",
    "+map+prefetch(AUTOTUNE)",
    "+map+prefetch, autotune off",
    "+map+prefetch, dropped on another thread",
    "tfdist.MirroredStrategy input (4 replicas)",
)
STEPS_PER_EPOCH = 30
BATCH = 512


def run_pipeline(name: str, epochs: int) -> list[float]:
    """Set-up milliseconds of every epoch of `name` (this process)."""
    import time

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import tfdist
    from tfdist.data.distributed import iterator_reaper

    tfdist.testing.use_logical_cpus(4)
    rng = np.random.default_rng(0)
    n = BATCH * STEPS_PER_EPOCH
    x = rng.normal(size=(n, 256)).astype("float32")
    y = rng.integers(0, 10, n).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n).batch(BATCH)
    if "map" in name:
        dataset = dataset.map(lambda a, b: (a * 1.0, b))
    if "prefetch" in name:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    if "autotune off" in name:
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.with_options(options)
    read = lambda element: element[0]  # noqa: E731
    if name.startswith("tfdist"):
        strategy = tfdist.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
        dataset = strategy.experimental_distribute_dataset(dataset)
        read = lambda element: strategy.experimental_local_results(element[0])[0]  # noqa: E731
    w1 = tf.Variable(tf.random.normal([256, 512]))
    w2 = tf.Variable(tf.random.normal([512, 512]))

    @tf.function
    def step(iterator):
        h = tf.nn.relu(read(next(iterator)) @ w1)
        for _ in range(3):
            h = tf.nn.relu(h @ w2)
        return tf.reduce_sum(h)

    setups, steps = [], []
    iterator = None
    for _ in range(epochs):
        start = time.perf_counter()
        iterator = iter(dataset)  # Drops the previous epoch's, as Keras does.
        if "another thread" in name:
            iterator_reaper.adopt(iterator)
        step(iterator)
        setups.append(time.perf_counter() - start)
        try:
            while True:
                begin = time.perf_counter()
                step(iterator)
                steps.append(time.perf_counter() - begin)
        except tf.errors.OutOfRangeError:
            pass
    median_step = float(np.median(steps))
    return [(s - median_step) * 1000 for s in setups]


def main(argv: list[str]) -> None:
    del argv
    if _PIPELINE.value:
        print("RESULT " + json.dumps(run_pipeline(_PIPELINE.value, _EPOCHS.value)), flush=True)
        return
    print(f"\n### Epoch set-up: {STEPS_PER_EPOCH} batches of {BATCH} per epoch, "
          f"{_EPOCHS.value} epochs, each pipeline in its own process\n")
    print("| pipeline | median set-up (ms) | largest (ms) | epochs over 100 ms |")
    print("|---|---|---|---|")
    for name in PIPELINES:
        output = subprocess.run(
            [sys.executable, __file__, f"--pipeline={name}", f"--epochs={_EPOCHS.value}"],
            check=True, capture_output=True, text=True).stdout
        setups = json.loads(output.split("RESULT ", 1)[1])[1:]  # The first epoch traces.
        slow = sum(s > 100 for s in setups)
        print(f"| {name} | {np.median(setups):.0f} | {max(setups):.0f} | "
              f"{slow} of {len(setups)} |", flush=True)


if __name__ == "__main__":
    app.run(main)
