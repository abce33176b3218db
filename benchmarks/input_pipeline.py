"""Input throughput: tfdist.data.shard / split_batches vs plain tf.data pipelines.

    python benchmarks/input_pipeline.py [--num_elements=200000] [--feature_dim=32]
        [--global_batch_size=256] [--num_replicas=1] [--epochs=5] [--repeats=3]

Both pipelines read the same in-memory numpy arrays (float32 features of
`feature_dim`, int64 labels) and no model runs. The plain pipeline is
`from_tensor_slices(...).shuffle(N).batch(b).prefetch(AUTOTUNE)` (a full
shuffle buffer, the only plain pipeline that also permutes the whole
dataset each epoch); the sharded one is `tfdist.data.shard(...)` for input
pipeline 0 of one, feeding `num_replicas` replicas, so both yield
per-replica batches of b = global_batch_size / num_replicas. One timed run
iterates `epochs` epochs with `Dataset.reduce` (in C++, no Python per
batch); contenders alternate per repeat so background load hits both
alike, and the median run counts. The one-time cost of building the sharded
pipeline (materializing the data, tracing) is reported separately, and so is
an unshuffled `batch(b)` pipeline: the ceiling for any pipeline over these
arrays. Last, the path tfdist strategies take for a plain dataset:
`split_batches` over `shuffle(N).batch(global_batch_size)`, against that
global-batch pipeline alone (the overhead of splitting).

Prints a markdown table row and the exact command.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from tfdist.data import shard
from tfdist.data import split_batches

_NUM_ELEMENTS = flags.DEFINE_integer(
    "num_elements", 200_000, "Examples in the dataset.", lower_bound=1
)
_FEATURE_DIM = flags.DEFINE_integer(
    "feature_dim", 32, "float32 features per example.", lower_bound=1
)
_GLOBAL_BATCH_SIZE = flags.DEFINE_integer(
    "global_batch_size", 256, "Batch size summed over replicas.", lower_bound=1
)
_NUM_REPLICAS = flags.DEFINE_integer(
    "num_replicas", 1, "Replicas the one input pipeline feeds.", lower_bound=1
)
_EPOCHS = flags.DEFINE_integer(
    "epochs", 5, "Epochs per timed run.", lower_bound=1
)
_REPEATS = flags.DEFINE_integer(
    "repeats", 3, "Timed runs per contender.", lower_bound=1
)


def _count_batches(dataset: tf.data.Dataset) -> int:
    """Iterates one epoch in C++; returns the number of batches."""
    return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def _timed_run(dataset: tf.data.Dataset, epochs: int) -> float:
    start = time.perf_counter()
    for _ in range(epochs):
        _count_batches(dataset)
    return time.perf_counter() - start


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    num_elements = _NUM_ELEMENTS.value
    num_replicas = _NUM_REPLICAS.value
    per_replica = _GLOBAL_BATCH_SIZE.value // num_replicas
    rng = np.random.default_rng(0)
    features = rng.standard_normal(
        [num_elements, _FEATURE_DIM.value], dtype=np.float32
    )
    labels = rng.integers(0, 10, [num_elements], dtype=np.int64)
    source = tf.data.Dataset.from_tensor_slices((features, labels))

    plain = (
        source.shuffle(num_elements, seed=0)
        .batch(per_replica)
        .prefetch(tf.data.AUTOTUNE)
    )
    unshuffled = source.batch(per_replica).prefetch(tf.data.AUTOTUNE)
    build_start = time.perf_counter()
    sharded = shard(
        source,
        tf.distribute.InputContext(1, 0, num_replicas),
        global_batch_size=_GLOBAL_BATCH_SIZE.value,
        seed=0,
    )
    build_s = time.perf_counter() - build_start

    plain_global = (
        source.shuffle(num_elements, seed=0)
        .batch(_GLOBAL_BATCH_SIZE.value)
        .prefetch(tf.data.AUTOTUNE)
    )
    split = split_batches(plain_global, tf.distribute.InputContext(1, 0, num_replicas))
    contenders = {
        "plain": plain,
        "sharded": sharded,
        "unshuffled": unshuffled,
        "plain_global": plain_global,
        "split": split,
    }
    for dataset in contenders.values():  # Warm-up: one epoch each.
        _timed_run(dataset, 1)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(_REPEATS.value):
        for name, dataset in contenders.items():
            times[name].append(_timed_run(dataset, _EPOCHS.value))

    examples = num_elements * _EPOCHS.value
    rate = {
        name: examples / statistics.median(values)
        for name, values in times.items()
    }
    ratio = rate["sharded"] / rate["plain"]
    print(f"Command: {' '.join([sys.executable, *sys.argv])}")
    print()
    print(
        "| N | features | global batch | replicas | epochs | plain elem/s "
        "| sharded elem/s | sharded / plain | overhead | unshuffled elem/s "
        "| shard() build s | split_batches elem/s | split / plain global |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {num_elements} | {_FEATURE_DIM.value} | "
        f"{_GLOBAL_BATCH_SIZE.value} | {num_replicas} | {_EPOCHS.value} | "
        f"{rate['plain']:,.0f} | {rate['sharded']:,.0f} | {ratio:.3f} | "
        f"{max(0.0, 1 - ratio):.1%} | {rate['unshuffled']:,.0f} | "
        f"{build_s:.2f} | {rate['split']:,.0f} | "
        f"{rate['split'] / rate['plain_global']:.3f} |"
    )


if __name__ == "__main__":
    app.run(main)
