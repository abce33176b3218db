"""What the fault tests share: bounds, the worker program, and reading what it wrote.

The tests run real processes on 127.0.0.1 (`fault_script.py` is the worker
program) and bound every job by a hard kill.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tests import forked_script
from tests.integration import fault_script

# Imported (not only run) so that Bazel ships it with this test.
SCRIPT = os.path.abspath(fault_script.__file__)
TIMEOUT_S = 20.0
# Detection runs every second; the margin covers scheduling on 2 busy cores.
MARGIN_S = 10.0
# Hard bound on any one job of the fault tests (start-up is ~5 s per process).
JOB_LIMIT_S = 150
# Same examples and initial weights; only float32 summation order differs.
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-6


def env(tf_config: str | None = None, *, tf_keras: bool = False) -> dict[str, str]:
    """The environment of a worker program: thread bounds for 2 cores, front end, TF_CONFIG."""
    variables = dict(os.environ)
    variables.update(TF_NUM_INTEROP_THREADS="3", TF_NUM_INTRAOP_THREADS="1")
    if tf_keras:
        variables["TF_USE_LEGACY_KERAS"] = "1"
    if tf_config is not None:
        variables["TF_CONFIG"] = tf_config
    return variables


def tf_config(addresses: list[str], index: int) -> str:
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )


def launch(
    out_dir: str, *launcher_args: str, mode: str, tf_keras: bool = False
) -> subprocess.CompletedProcess:
    """Runs the worker program under `tfdist-launch` (2 workers unless `launcher_args` say)."""
    if "--workers" not in launcher_args:
        launcher_args = ("--workers", "2", *launcher_args)
    return subprocess.run(
        [sys.executable, "-m", "tfdist.launch", "--preload", "tensorflow", *launcher_args,
         "--", sys.executable, SCRIPT, mode, out_dir, str(TIMEOUT_S)],
        env=env(tf_keras=tf_keras), capture_output=True, text=True, timeout=JOB_LIMIT_S,
    )


class Task(forked_script.ForkedScript):
    """One task of the worker program, without a launcher: forked from a
    template process that has imported TensorFlow (`tests/forked_script.py`).

    Its stdout is discarded and its stderr kept (`stderr`, complete once it
    has exited).
    """

    def __init__(
        self, mode: str, out_dir: str, tf_config: str | None = None, *, tf_keras: bool = False
    ) -> None:
        super().__init__(
            [sys.executable, SCRIPT, mode, out_dir, str(TIMEOUT_S)],
            env(tf_config, tf_keras=tf_keras), cwd=os.getcwd(), keep_stdout=False,
        )

    def kill(self, timeout: float = JOB_LIMIT_S) -> None:
        """SIGKILLs it and what it started, if still running; waits for its exit."""
        super().kill(timeout)


def weights(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def reference_weights(out_dir: str, *, tf_keras: bool = False) -> list[np.ndarray]:
    """The final weights of the worker program's `reference` mode (one process, no strategy)."""
    task = Task("reference", out_dir, tf_keras=tf_keras)
    try:
        code = task.wait(timeout=JOB_LIMIT_S)
    finally:
        task.kill()
    if code != 0:
        raise AssertionError(f"the reference run exited {code}:\n{task.stderr[-3000:]}")
    return weights(os.path.join(out_dir, "weights.npz"))


def epochs_begun(out_dir: str) -> list[list[int]]:
    """Per process that trained, the epochs it began (`fault_script`'s records)."""
    begun = []
    for name in os.listdir(out_dir):
        if name.startswith("epochs-begun-"):
            with open(os.path.join(out_dir, name)) as f:
                begun.append([int(line) for line in f.read().split()])
    return begun
