"""All-reduce time vs message size: tfdist's algorithms vs TF's built-ins.

    python benchmarks/allreduce.py [--devices=4] [--sizes_mib=1,4,16,64] [--plot=PATH]

Each contender is a `tf.distribute.MirroredStrategy` over N logical CPUs
with its cross-device ops; one timed call is `ReplicaContext.all_reduce`
of one float32 tensor of S bytes per replica, inside a `tf.function`.
Contenders are interleaved per repeat so background load hits all alike.

The bandwidth bound for one all-reduce is n*S bytes read plus S written,
at the copy bandwidth measured in the same run (single-threaded numpy copy
of the largest size: bytes read + written per second). TF's kernels may use
both cores, so a result can beat this "bound" slightly.

Above glibc's mmap threshold every fresh output buffer is page-faulted in;
run once more with TF_CPU_ALLOCATOR_USE_BFC=true in the environment to
measure with TensorFlow's pooling CPU allocator instead.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np

import tfdist

_DEVICES = flags.DEFINE_integer("devices", 4, "Logical CPUs.", lower_bound=2)
_SIZES_MIB = flags.DEFINE_list("sizes_mib", ["1", "4", "16", "64"], "Message sizes, MiB.")
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed calls per contender and size.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG plot of time vs size here.")


def contenders(devices):
    import tensorflow as tf

    return {
        "tf CollectiveAllReduce (default)": tf.distribute.MirroredStrategy(list(devices)),
        "tf ReductionToOneDevice": tf.distribute.MirroredStrategy(
            list(devices), cross_device_ops=tf.distribute.ReductionToOneDevice()),
        # Every replica's result is returned, so this is a full all-reduce:
        # tell the strategy (its host-memory default would let "auto" plan
        # for a reduce to the first device only).
        **{
            f"tfdist {name}": tfdist.MirroredStrategy(
                devices, all_reduce=name, update_once_on_host=False)
            for name in ("auto", "ring", "tree", "reduce_to_one")
        },
    }


def make_step(strategy, num_elements):
    import tensorflow as tf

    with strategy.scope():
        value = tf.Variable(tf.ones([num_elements]), trainable=False)

    @tf.function
    def step():
        def fn():
            return tf.distribute.get_replica_context().all_reduce(
                "sum", tf.identity(value))
        return strategy.experimental_local_results(strategy.run(fn))

    return step


def copy_bandwidth_bytes_per_s(num_bytes: int) -> float:
    source = np.ones(num_bytes // 4, np.float32)
    target = np.empty_like(source)
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(target, source)
        timings.append(time.perf_counter() - start)
    return 2 * num_bytes / min(timings)


def main(argv: Sequence[str]) -> None:
    del argv
    devices = tfdist.simulate_cpu_devices(_DEVICES.value)
    n = len(devices)
    sizes = [int(float(s) * (1 << 20)) for s in _SIZES_MIB.value]
    strategies = contenders(devices)
    results: dict[str, dict[int, float]] = {name: {} for name in strategies}
    for size in sizes:
        steps = {name: make_step(s, size // 4) for name, s in strategies.items()}
        for step in steps.values():
            step()  # Trace, calibrate ("auto") and warm up.
        timings: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(_REPEATS.value):
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                timings[name].append(time.perf_counter() - start)
        for name, t in timings.items():
            results[name][size] = statistics.median(t)
    bandwidth = copy_bandwidth_bytes_per_s(max(sizes))
    allocator = ("TF's BFC allocator" if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower()
                 in ("1", "true") else "glibc malloc")
    print(f"\n### all-reduce of one float32 tensor, {n} logical CPUs "
          f"(median of {_REPEATS.value}); copy bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"CPU tensors from {allocator}\n")
    print("| contender | " + " | ".join(f"{s / (1 << 20):g} MiB (ms)" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, by_size in results.items():
        print(f"| {name} | " + " | ".join(f"{by_size[s] * 1e3:.2f}" for s in sizes) + " |")
    tf_best = {s: min(v[s] for k, v in results.items() if k.startswith("tf ")) for s in sizes}
    print("\n| size | tfdist auto vs TF's fastest built-in (speed) | auto vs bandwidth bound |")
    print("|---|---|---|")
    for s in sizes:
        bound = (n * s + s) / bandwidth
        auto = results["tfdist auto"][s]
        print(f"| {s / (1 << 20):g} MiB | {tf_best[s] / auto:.2f}x | {auto / bound:.2f}x bound |")
    if _PLOT.value:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, by_size in results.items():
            ax.plot([s / (1 << 20) for s in sizes], [by_size[s] * 1e3 for s in sizes],
                    marker="o", linestyle="--" if name.startswith("tf ") else "-", label=name)
        ax.plot([s / (1 << 20) for s in sizes], [(n * s + s) / bandwidth * 1e3 for s in sizes],
                color="black", linestyle=":", label="bandwidth bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size per replica (MiB)")
        ax.set_ylabel("time per all-reduce (ms)")
        ax.set_title(f"All-reduce on {n} logical CPUs")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(_PLOT.value, dpi=110)
        print(f"\nplot: {_PLOT.value}")


if __name__ == "__main__":
    app.run(main)
