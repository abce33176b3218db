"""Tensor parallelism on TensorFlow: TF's DTensor against explicit sharded computation.

    python benchmarks/mesh_route.py [--batch=256] [--width=1024] [--steps=10] [--repeats=3]

The question this answers (before tfdist's mesh strategy is built on one of
them): which way of splitting one layer's weights over devices TensorFlow
runs faster and more predictably. The workload is Megatron's MLP block,
a column-parallel Dense(4·width, relu) then a row-parallel Dense(width),
with a mean-square loss and one SGD update per step, split 2-way over 2
logical CPUs:

- `one device`: the block unsplit, on one CPU (the baseline);
- `explicit`: each device holds its column slice of the first kernel (and
  bias) and its row slice of the second; each computes its partial output
  under `tf.device`, the partials are summed (the forward all-reduce), and
  each device's backward runs under its own device scope from the shared
  output gradient (the backward all-reduce of the input gradient is not
  needed here: the input is not trained);
- `dtensor`: the same layouts as `tf.experimental.dtensor` `DVariable`s on a
  1-D mesh of the 2 CPUs; DTensor's SPMD expansion inserts the collectives.

Every contender runs in a process of its own with the same thread pools
(`--intra_op_threads`, 1 by default: one core per device, as if each
logical CPU were a device of its own, so the split can use 2 cores where
one device uses 1; 3 inter-op threads, so both shards run at once) and the
same initial weights; each
prints its median step time over `repeats` timed runs of `steps` steps
(after 3 untimed steps that trace) and, as a check that it computes the
same block, the largest difference of its weights after those steps from
one device's (float32 rounding is ~1e-6 relative).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

_BATCH = flags.DEFINE_integer("batch", 256, "Rows per step.")
_WIDTH = flags.DEFINE_integer("width", 1024, "The block's input and output width (hidden: 4x).")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps per repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (the median is reported).")
_INTRA_OP_THREADS = flags.DEFINE_integer(
    "intra_op_threads", 1,
    "Intra-op threads of every contender: 1 stands for one core per device (a split "
    "can then use 2 cores where one device uses 1; the ideal speed-up is 2x); 2 lets "
    "one device use both cores too.",
)
_CONTENDER = flags.DEFINE_enum(
    "contender", None, ["one_device", "explicit", "dtensor"],
    "Internal: run one contender in this process and print JSON.",
)

_WARMUP_STEPS = 3
_LEARNING_RATE = 0.01


def _initial_weights(width: int):
    import numpy as np  # noqa: PLC0415 - the parent process needs no NumPy.

    rng = np.random.default_rng(0)
    hidden = 4 * width
    return {
        "w1": rng.normal(0, width ** -0.5, (width, hidden)).astype("float32"),
        "b1": np.zeros(hidden, "float32"),
        "w2": rng.normal(0, hidden ** -0.5, (hidden, width)).astype("float32"),
        "b2": np.zeros(width, "float32"),
        "x": rng.normal(0, 1, (_BATCH.value, width)).astype("float32"),
    }


def _whole_block_step(tf, weights, x):
    """One SGD step of the block written whole (one device's, and DTensor's: the layouts split it)."""

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            w1, b1, w2, b2 = weights
            z = tf.nn.relu(x @ w1 + b1) @ w2 + b2
            loss = tf.reduce_mean(tf.square(z))
        for variable, gradient in zip(weights, tape.gradient(loss, weights)):
            variable.assign_sub(_LEARNING_RATE * gradient)

    return step


def _one_device(tf, init):
    with tf.device("/CPU:0"):
        weights = [tf.Variable(init[k]) for k in ("w1", "b1", "w2", "b2")]
        x = tf.constant(init["x"])

    step = _whole_block_step(tf, weights, x)

    def whole():
        return {k: v.numpy() for k, v in zip(("w1", "b1", "w2", "b2"), weights)}

    return step, whole


def _explicit(tf, init):
    import numpy as np  # noqa: PLC0415

    devices = ("/CPU:0", "/CPU:1")
    shards = []
    for i, device in enumerate(devices):
        with tf.device(device):
            shards.append([
                tf.Variable(np.split(init["w1"], 2, axis=1)[i]),
                tf.Variable(np.split(init["b1"], 2)[i]),
                tf.Variable(np.split(init["w2"], 2, axis=0)[i]),
            ])
    with tf.device(devices[0]):
        b2 = tf.Variable(init["b2"])
        x = tf.constant(init["x"])

    @tf.function
    def step():
        partials, tapes = [], []
        for device, (w1, b1, w2) in zip(devices, shards):
            with tf.device(device), tf.GradientTape() as tape:
                partials.append(tf.nn.relu(tf.identity(x) @ w1 + b1) @ w2)
            tapes.append(tape)
        with tf.device(devices[0]), tf.GradientTape() as top:
            top.watch(partials)
            z = tf.add_n(partials) + b2  # The forward all-reduce.
            loss = tf.reduce_mean(tf.square(z))
        *d_partials, d_b2 = top.gradient(loss, partials + [b2])
        b2.assign_sub(_LEARNING_RATE * d_b2)
        for device, tape, d_partial, variables in zip(devices, tapes, d_partials, shards):
            with tf.device(device):
                gradients = tape.gradient(partials[devices.index(device)], variables,
                                          output_gradients=tf.identity(d_partial))
                for variable, gradient in zip(variables, gradients):
                    variable.assign_sub(_LEARNING_RATE * gradient)

    def whole():
        return {
            "w1": np.concatenate([s[0].numpy() for s in shards], axis=1),
            "b1": np.concatenate([s[1].numpy() for s in shards]),
            "w2": np.concatenate([s[2].numpy() for s in shards], axis=0),
            "b2": b2.numpy(),
        }

    return step, whole


def _dtensor(tf, init):
    from tensorflow.experimental import dtensor  # noqa: PLC0415

    mesh = dtensor.create_mesh([("model", 2)], devices=["CPU:0", "CPU:1"])
    unsharded = dtensor.UNSHARDED

    def variable(value, *axes):
        whole = dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout.replicated(mesh, rank=len(axes)))
        return dtensor.DVariable(dtensor.relayout(whole, dtensor.Layout(list(axes), mesh)))

    weights = [
        variable(init["w1"], unsharded, "model"),
        variable(init["b1"], "model"),
        variable(init["w2"], "model", unsharded),
        variable(init["b2"], unsharded),
    ]
    x = dtensor.copy_to_mesh(tf.constant(init["x"]), dtensor.Layout.replicated(mesh, rank=2))

    step = _whole_block_step(tf, weights, x)  # DTensor's SPMD splits it by the layouts.

    def whole():
        return {
            k: dtensor.relayout(v.read_value(), dtensor.Layout.replicated(mesh, rank=v.shape.rank)).numpy()
            for k, v in zip(("w1", "b1", "w2", "b2"), weights)
        }

    return step, whole


def _run_contender(name: str) -> dict:
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )
    tf.config.threading.set_intra_op_parallelism_threads(_INTRA_OP_THREADS.value)
    tf.config.threading.set_inter_op_parallelism_threads(3)
    init = _initial_weights(_WIDTH.value)
    step, whole = {"one_device": _one_device, "explicit": _explicit, "dtensor": _dtensor}[name](tf, init)
    reference_step, reference_whole = _one_device(tf, init)
    for _ in range(_WARMUP_STEPS):
        step()
        reference_step()
    got, want = whole(), reference_whole()
    difference = max(
        float(np.max(np.abs(got[k] - want[k])) / (np.max(np.abs(want[k])) + 1e-30)) for k in want
    )
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        for _ in range(_STEPS.value):
            step()
        whole()  # Waits for the last step.
        times.append((time.perf_counter() - start) / _STEPS.value)
    return {"step_s": statistics.median(times), "relative_difference": difference}


def main(argv):
    del argv
    if _CONTENDER.value:
        print(json.dumps(_run_contender(_CONTENDER.value)))
        return
    rows = {}
    for name in ("one_device", "explicit", "dtensor"):
        output = subprocess.run(
            [sys.executable, __file__, f"--contender={name}"] + sys.argv[1:],
            check=True, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        ).stdout
        rows[name] = json.loads(output.strip().splitlines()[-1])
    base = rows["one_device"]["step_s"]
    print(f"Command: python benchmarks/mesh_route.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"MLP block {_WIDTH.value} -> {4 * _WIDTH.value} -> {_WIDTH.value}, batch {_BATCH.value}, "
          f"2 logical CPUs ({_INTRA_OP_THREADS.value} intra-op, 3 inter-op threads)\n")
    print("| contender | step (ms) | speed-up vs one device | weights vs one device (max rel. diff) |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['step_s'] * 1e3:.1f} | {base / row['step_s']:.2f}x | "
              f"{row['relative_difference']:.1e} |")


if __name__ == "__main__":
    app.run(main)
