"""Memory: bytes per device against model size, data parallel against tensor parallel and hybrid meshes.

    python benchmarks/mesh_memory.py [--widths=256,512,1024,2048] [--budget_mib=64] [--plot=PATH]

The point of a mesh's model axis is a model whose weights and optimizer
slots exceed one device's share: data parallelism keeps all of them on every
device, a model axis of size M splits the large ones M ways. This measures
it on Megatron's MLP block (Dense(4·width, relu) -> Dense(width) ->
Dense(10), Adam: two slots per weight) at several widths, on 4 logical CPUs:

- `data parallel`: `tfdist.MirroredStrategy` over the 4 devices (every
  device holds every variable);
- `mesh 4x1`: `tfdist.MeshStrategy`, the batch split 4 ways, every weight
  whole;
- `hybrid 2x2`: the batch split 2 ways, the large layers 2 ways (automatic
  layouts: Megatron's);
- `tensor 1x4`: the large layers split 4 ways.

Each contender and width runs in a process of its own: it builds the model,
trains 2 steps of batch 64 with `fit` (so Adam's slots exist and the split
model is shown to train: its loss is printed beside one device's), and
reads the bytes the busiest device holds from the variables themselves
(`MeshStrategy.bytes_per_device()`: each variable's slice; under data
parallelism, every variable whole). A budget per device
(`--budget_mib`, notional: logical CPUs share the host's memory) shows the
largest width each contender can hold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

_WIDTHS = flags.DEFINE_list("widths", ["256", "512", "1024", "2048"], "MLP widths (hidden: 4x).")
_BUDGET_MIB = flags.DEFINE_float("budget_mib", 64.0, "A notional memory budget per device, MiB.")
_PLOT = flags.DEFINE_string("plot", None, "Write a PNG plot of bytes per device against model size here.")
_CONTENDER = flags.DEFINE_string("contender", None, "Internal: 'name:width', run in this process.")

CONTENDERS = {
    "one_device": "one device",
    "data_parallel": "data parallel (tfdist.MirroredStrategy)",
    "mesh_4x1": "mesh 4x1 (batch split)",
    "hybrid_2x2": "hybrid 2x2",
    "tensor_1x4": "tensor 1x4",
}
_BATCH = 64
_STEPS = 2


def _run_contender(name: str, width: int) -> dict:
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import tfdist  # noqa: PLC0415

    tfdist.simulate_cpu_devices(4)
    keras = tf.keras
    strategy = {
        "one_device": tf.distribute.get_strategy,
        "data_parallel": tfdist.MirroredStrategy,
        "mesh_4x1": lambda: tfdist.MeshStrategy({"batch": 4, "model": 1}, layout_map=None),
        "hybrid_2x2": lambda: tfdist.MeshStrategy({"batch": 2, "model": 2}, layout_map=None),
        "tensor_1x4": lambda: tfdist.MeshStrategy({"batch": 1, "model": 4}, layout_map=None),
    }[name]()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(_BATCH * _STEPS, width)).astype("float32")
    y = rng.integers(0, 10, _BATCH * _STEPS).astype("int32")
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((width,)),
            keras.layers.Dense(4 * width, activation="relu", name="up"),
            keras.layers.Dense(width, name="down"),
            keras.layers.Dense(10, name="head"),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=_BATCH, epochs=1, shuffle=False, verbose=0)
    whole = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                for v in model.weights + model.optimizer.variables)
    held = strategy.bytes_per_device()[0] if isinstance(strategy, tfdist.MeshStrategy) else whole
    return {"held": held, "whole": whole, "loss": history.history["loss"][-1]}


def main(argv):
    del argv
    if _CONTENDER.value:
        name, width = _CONTENDER.value.split(":")
        print(json.dumps(_run_contender(name, int(width))))
        return
    widths = [int(w) for w in _WIDTHS.value]
    results: dict[str, dict[int, dict]] = {name: {} for name in CONTENDERS}
    for width in widths:
        for name in CONTENDERS:
            output = subprocess.run(
                [sys.executable, __file__, f"--contender={name}:{width}"],
                check=True, capture_output=True, text=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "0"},
            ).stdout
            results[name][width] = json.loads(output.strip().splitlines()[-1])
    mib = 2**20
    budget = _BUDGET_MIB.value
    shown = [name for name in CONTENDERS if name != "one_device"]
    print(f"Command: python benchmarks/mesh_memory.py {' '.join(sys.argv[1:])}".rstrip())
    print("Megatron's MLP + Adam on 4 logical CPUs; MiB of variables (weights, Adam slots) on the busiest "
          f"device; loss after {_STEPS} steps of {_BATCH} (one device's in the last column)\n")
    print("| width | model (MiB, with Adam's slots) | " + " | ".join(CONTENDERS[n] for n in shown)
          + " | loss: " + ", ".join(n for n in shown) + " | loss, one device |")
    print("|" + "---|" * (len(shown) + 4))
    for width in widths:
        whole = results["one_device"][width]["whole"] / mib
        cells = [f"{results[n][width]['held'] / mib:.1f}" + (" *" if results[n][width]["held"] / mib > budget else "")
                 for n in shown]
        losses = ", ".join(f"{results[n][width]['loss']:.6f}" for n in shown)
        print(f"| {width} | {whole:.1f} | " + " | ".join(cells)
              + f" | {losses} | {results['one_device'][width]['loss']:.6f} |")
    print(f"\n* over a budget of {budget:g} MiB per device.")
    for name in shown:
        fits = [w for w in widths if results[name][w]["held"] / mib <= budget]
        print(f"- {CONTENDERS[name]}: largest width within {budget:g} MiB per device: "
              f"{max(fits) if fits else 'none'}")
    if _PLOT.value:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415

        fig, ax = plt.subplots(figsize=(7, 4.5))
        sizes = [results["one_device"][w]["whole"] / mib for w in widths]
        for name in shown:  # Data parallel drawn wide: the batch-split mesh lies on it.
            ax.plot(sizes, [results[name][w]["held"] / mib for w in widths], marker="o", label=CONTENDERS[name],
                    linewidth=6 if name == "data_parallel" else 1.5, alpha=0.5 if name == "data_parallel" else 1.0)
        ax.axhline(budget, color="grey", linestyle="--", label=f"a budget of {budget:g} MiB per device")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("model: weights and Adam's slots (MiB)")
        ax.set_ylabel("held by the busiest device (MiB)")
        ax.set_title("Bytes per device, 4 logical CPUs")
        ax.legend()
        fig.tight_layout()
        fig.savefig(_PLOT.value, dpi=100)
        print(f"\nplot: {_PLOT.value}")


if __name__ == "__main__":
    app.run(main)
