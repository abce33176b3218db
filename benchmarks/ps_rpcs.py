"""Parameter-server training: RPCs per step, tfdist.ParameterServerStrategy vs TF's.

    python benchmarks/ps_rpcs.py [--steps=200] [--only=NAME ...]

The same run as `benchmarks/ps.py` (in-process cluster of 2 workers and 2
ps, MLP, batch 64, 2 epochs of `--steps` steps; configurations by the
same names), each in a child process with gRPC's HTTP/2 trace on
(`GRPC_TRACE=http`). Every call a process starts logs its method in the
headers it sends; the script counts them by method over the whole fit
(tracing included) and prints calls per step. On a cluster of processes
each of these calls crosses the network: RecvTensor (a tensor one task's
partition of a function needs from another), Enqueue (an eager op or
function the chief, or a worker, runs on another task),
RunComponentFunction (a partition of a multi-device function run on
another task).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from collections.abc import Sequence

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ps  # noqa: E402  (the benchmark whose run this counts)

# --steps and --only are benchmarks/ps.py's flags.
_CHILD = flags.DEFINE_string("child", None, "Internal: run this configuration here.")
FLAGS = flags.FLAGS

_CALL = re.compile(r"perform_stream_op\[.*?SEND_INITIAL_METADATA\{.*?:path: /tensorflow\.(?:eager\.)?\w+/(\w+)")
METHODS = ("RecvTensor", "Enqueue", "RunComponentFunction")


def count(name: str, steps: int) -> collections.Counter[str]:
    """Calls by method in one run of configuration `name` (a child process)."""
    legacy = ps.CONFIGURATIONS[name][2]
    env = dict(
        os.environ, TF_USE_LEGACY_KERAS=legacy, GRPC_VERBOSITY="debug", GRPC_TRACE="http"
    )
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), f"--child={name}", f"--steps={steps}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        timeout=900,
        check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(f"{name}: exit {child.returncode}: {child.stderr[-2000:]}")
    return collections.Counter(
        match.group(1) for match in map(_CALL.search, child.stderr.splitlines()) if match
    )


def main(argv: Sequence[str]) -> None:
    del argv
    if _CHILD.value is not None:
        strategy_name, mode, _ = ps.CONFIGURATIONS[_CHILD.value]
        ps.measure(strategy_name, mode, FLAGS.steps)
        return
    names = [n for n in ps.CONFIGURATIONS if FLAGS.only is None or n in FLAGS.only]
    total_steps = 2 * FLAGS.steps
    print(f"| configuration | {' | '.join(METHODS)} | all (per step, over {total_steps} steps) |")
    print("|---|" + "---|" * (len(METHODS) + 1))
    for name in names:
        calls = count(name, FLAGS.steps)
        cells = [f"{calls[m] / total_steps:.1f}" for m in METHODS]
        print(f"| {name} | {' | '.join(cells)} | {sum(calls.values()) / total_steps:.1f} |", flush=True)


if __name__ == "__main__":
    app.run(main)
