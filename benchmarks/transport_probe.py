"""What a cross-worker all-reduce costs over gRPC, and what it could cost through shared memory.

    python benchmarks/transport_probe.py [--floats=400000] [--steps=60] [--runs=3]

A probe for issue 30's bound, not a tfdist feature. Two worker processes on
this machine (TF_CONFIG on 127.0.0.1) each time, in the same runs:

- `grpc`: TensorFlow's collective all-reduce (`all_reduce_v2`, ring), the
  op `tfdist.MultiWorkerMirroredStrategy`'s cross-worker step runs, in a
  `tf.function`;
- `shared memory`: the same sum inside a `tf.function` through a
  `tf.numpy_function`: each worker writes its tensor into a buffer in
  /dev/shm, sums its half of every worker's (a reduce-scatter), and reads
  the whole result; two FIFOs per worker carry the barriers.

Both are checked equal. The default size is the comm-bound benchmark's
gradient bucket (400,000 float32, 1.6 MB). Median milliseconds per call
over `--steps` calls after 5 warm-up calls, per run and worker.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app
from absl import flags

_FLOATS = flags.DEFINE_integer("floats", 400_000, "float32 values per all-reduce.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 60, "Timed calls per transport.", lower_bound=1)
_RUNS = flags.DEFINE_integer("runs", 3, "Runs (fresh processes each).", lower_bound=1)
_WORKER = flags.DEFINE_string("worker", None, "Run as worker RANK,DIR,CLUSTER_JSON (internal).")

_WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, directory: str, cluster: list[str]) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": rank}})
    import tensorflow as tf
    from tensorflow.python.ops import collective_ops

    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.distribute.MultiWorkerMirroredStrategy()  # Configures collectives: before any op.
    n, steps = _FLOATS.value, _STEPS.value
    fd = os.open(os.path.join(directory, "buffer"), os.O_RDWR)
    buffer = np.frombuffer(mmap.mmap(fd, (_WORLD + 1) * n * 4), dtype=np.float32).reshape(_WORLD + 1, n)
    inputs, result = buffer[:_WORLD], buffer[_WORLD]
    lo, hi = rank * n // _WORLD, (rank + 1) * n // _WORLD
    own = os.open(os.path.join(directory, f"fifo-{rank}"), os.O_RDWR)
    peers = [os.open(os.path.join(directory, f"fifo-{r}"), os.O_RDWR) for r in range(_WORLD) if r != rank]

    def barrier() -> None:
        for peer in peers:
            os.write(peer, b"x")
        got = 0
        while got < len(peers):
            got += len(os.read(own, len(peers) - got))

    def shared_memory_sum(x: np.ndarray) -> np.ndarray:
        inputs[rank] = x
        barrier()  # Every input written.
        np.add(inputs[0, lo:hi], inputs[1, lo:hi], out=result[lo:hi])
        barrier()  # Every part summed.
        out = result.copy()
        barrier()  # Every result read: the buffer may be written again.
        return out

    @tf.function
    def shared_memory(x):
        return tf.reshape(tf.numpy_function(shared_memory_sum, [x], tf.float32, stateful=True), [n])

    @tf.function
    def grpc(x):
        with tf.device(f"/job:worker/replica:0/task:{rank}/device:CPU:0"):
            return collective_ops.all_reduce_v2(
                x, group_size=_WORLD, group_key=1, instance_key=1, merge_op="Add", final_op="Id")

    x = tf.random.stateless_uniform([n], seed=[rank, 0])
    report = {"rank": rank}
    for name, call in (("grpc", grpc), ("shared memory", shared_memory)):
        for _ in range(5):
            last = call(x).numpy()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            last = call(x).numpy()
            times.append(time.perf_counter() - start)
        report[name] = 1e3 * float(np.median(times))
        report[f"{name} sum"] = last
    report["equal"] = bool(np.array_equal(report.pop("grpc sum"), report.pop("shared memory sum")))
    print(json.dumps(report), flush=True)


def _run_once() -> list[dict]:
    n = _FLOATS.value
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="tfdist-probe-") as directory:
        with open(os.path.join(directory, "buffer"), "wb") as f:
            f.truncate((_WORLD + 1) * n * 4)
        for rank in range(_WORLD):
            os.mkfifo(os.path.join(directory, f"fifo-{rank}"))
        cluster = [f"127.0.0.1:{_free_port()}" for _ in range(_WORLD)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        processes = [
            subprocess.Popen(
                [sys.executable, __file__, f"--worker={rank},{directory},{json.dumps(cluster)}",
                 f"--floats={n}", f"--steps={_STEPS.value}"],
                env=env, stdout=subprocess.PIPE, text=True)
            for rank in range(_WORLD)
        ]
        reports = []
        for process in processes:
            out, _ = process.communicate(timeout=600)
            if process.returncode != 0:
                raise RuntimeError(f"a worker exited {process.returncode}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports


def main(argv: list[str]) -> None:
    del argv
    if _WORKER.value is not None:
        rank, directory, cluster = _WORKER.value.split(",", 2)
        _worker(int(rank), directory, json.loads(cluster))
        return
    size_mb = _FLOATS.value * 4 / 1e6
    print(f"all-reduce of {_FLOATS.value} float32 ({size_mb:.1f} MB) between 2 workers on this machine, "
          "median ms per call:")
    for run in range(_RUNS.value):
        for report in _run_once():
            ratio = report["grpc"] / report["shared memory"]
            print(f"  run {run + 1} worker {report['rank']}: grpc {report['grpc']:.2f}  shared memory "
                  f"{report['shared memory']:.2f}  ({ratio:.2f}x)  equal: {report['equal']}")


if __name__ == "__main__":
    app.run(main)
