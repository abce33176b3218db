"""What one cross-worker all-reduce costs on this machine, without Keras.

    python benchmarks/cross_worker_latency.py [--calls=50]
        [--network=isolated|host|both] [--rounds=1]

Two worker processes on 127.0.0.1 (`tfdist.testing.run_local_cluster`, one
intra-op thread each) build `tfdist.MultiWorkerMirroredStrategy` and time a
`tf.function` that all-reduces one float32 tensor across the workers
(`ReplicaContext.all_reduce`, `transport="grpc"`: TF's collective ops,
the engine of every multi-worker step across hosts; between tasks of one
host the strategy's default is shared memory, `transport_probe.py`), for sizes from 4 bytes to the 1.6 MB of
gradients in `benchmarks/multiworker.py`. The 4-byte time is the floor any
synchronous step pays; it bounds the scaling efficiency a model can reach:
efficiency <= t1 / (t1 + 2 * floor) for a step that takes t1 on one worker
and half of it on each of two.

`--network` says where the workers talk: `isolated` (a private network
namespace, tfdist-launch's default), `host` (the host's network,
`--no-isolate`), or `both`, alternated round by round, with the ratio.
Medians over `--rounds` runs are reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from absl import app
from absl import flags

from tfdist.testing import run_local_cluster

_CALLS = flags.DEFINE_integer("calls", 50, "Timed all-reduces per size.", lower_bound=2)
_NETWORK = flags.DEFINE_enum(
    "network", "isolated", ["isolated", "host", "both"],
    "Where the workers' servers listen: a private network namespace, the "
    "host's network, or both (alternated per round).")
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Runs per network.", lower_bound=1)
SIZES_BYTES = (4, 64 * 1024, 400 * 1024, 1600 * 1024)
ENV = {"TF_NUM_INTRAOP_THREADS": "1"}


def all_reduce_ms(calls: int) -> dict[int, float]:
    """Runs in each task: median ms per all-reduce, by message size."""
    import tensorflow as tf

    import tfdist

    strategy = tfdist.MultiWorkerMirroredStrategy(transport="grpc")
    results = {}
    for size in SIZES_BYTES:
        value = tf.ones([size // 4], tf.float32)

        @tf.function
        def step(v):
            return strategy.run(
                # tf.identity places the value on the replica's device; the
                # argument itself has none, and reductions need one.
                lambda t: tf.distribute.get_replica_context().all_reduce(
                    "SUM", tf.identity(t)),
                args=(v,),
            )

        step(value)  # Trace and warm up.
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            strategy.experimental_local_results(step(value))[0].numpy()
            times.append((time.perf_counter() - start) * 1000)
        results[size] = statistics.median(times)
    return results


def main(argv: Sequence[str]) -> None:
    del argv
    networks = ["isolated", "host"] if _NETWORK.value == "both" else [_NETWORK.value]
    runs_ms = {network: {size: [] for size in SIZES_BYTES} for network in networks}
    for _ in range(_ROUNDS.value):
        for network in networks:
            per_task = run_local_cluster(
                all_reduce_ms, num_workers=2, args=(_CALLS.value,), timeout_s=300,
                env=ENV, isolate=network == "isolated")
            for size in SIZES_BYTES:  # The slower worker's time.
                runs_ms[network][size].append(max(task[size] for task in per_task))
    ms = {network: {size: statistics.median(runs) for size, runs in by_size.items()}
          for network, by_size in runs_ms.items()}
    if len(networks) == 1:
        (by_size,) = ms.values()
        print("\n| bytes | ms per all-reduce (slower worker) | MB/s |")
        print("|---|---|---|")
        for size in SIZES_BYTES:
            print(f"| {size:,} | {by_size[size]:.2f} | {size / by_size[size] / 1000:.1f} |")
        return
    print(f"\nmedian of {_ROUNDS.value} round(s), slower worker, ms per all-reduce")
    print("| bytes | isolated | host network | isolated / host |")
    print("|---|---|---|---|")
    for size in SIZES_BYTES:
        isolated, host = ms["isolated"][size], ms["host"][size]
        print(f"| {size:,} | {isolated:.2f} | {host:.2f} | {isolated / host:.2f} |")


if __name__ == "__main__":
    app.run(main)
