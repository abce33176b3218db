"""A worker program for the fault tests (run as a script, one per task).

    python fault_script.py MODE OUT_DIR [TIMEOUT_S]

Builds `tfdist.MultiWorkerMirroredStrategy(timeout_s=TIMEOUT_S)` from
TF_CONFIG and trains a small model for 3 epochs of 8 steps. MODE:

- `kill`: worker 1 kills itself (SIGKILL) at step 3 of epoch 2, after
  writing the time to OUT_DIR/killed_at; the survivors write what `fit`
  raised to OUT_DIR/<task>.json.
- `stall`: as `kill`, but worker 1 stays alive and stops taking part: it
  writes OUT_DIR/killed_at and sleeps (a stuck peer).
- `stall_before_build`: worker 1 builds the strategy, writes
  OUT_DIR/killed_at and sleeps before building the model (a slow data
  load or a debugger), so the others wait in the initial broadcast of
  variable values.
- `mesh_kill`, `mesh_stall`: as `kill` and `stall`, under `tfdist.MeshStrategy({"batch": 2, "model": 2},
  timeout_s=TIMEOUT_S)` on 2 logical CPUs per worker.
- `host_kill`, `host_stall`: as `kill` and `stall`, with the strategy's
  default transport (shared memory between these tasks); `kill`, `stall`
  and `stall_before_build` take `transport="grpc"`.
Every task appends each epoch it begins to OUT_DIR/epochs-begun-<pid>.

- `restart`: trains with `keras.callbacks.BackupAndRestore(OUT_DIR/backup)`;
  on its first attempt (no OUT_DIR/attempted-worker-1 yet) worker 1
  kills itself at step 3 of epoch 2. The chief writes the final weights to
  OUT_DIR/weights.npz.
- `reference`: `restart` without a failure, in one process and without a
  strategy, writing OUT_DIR/weights.npz.

Parameter-server modes (a chief, workers and ps tasks; every task runs
this script: `tfdist.ParameterServerStrategy(mode="sync")` serves on the
worker and ps tasks, each ps writes its pid to OUT_DIR/ps-<index>.pid, and
the chief trains):

- `ps_kill`: the chief kills ps:0 (SIGKILL) at step 3 of epoch 2, after
  writing the time to OUT_DIR/killed_at, and writes what `fit` raised to
  OUT_DIR/chief:0.json.
- `ps_restart`: as `restart`, with the chief killing ps:0 on its first
  attempt (no OUT_DIR/attempted-chief-0 yet); the chief writes the final
  weights to OUT_DIR/weights.npz.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import tfdist

keras = tf.keras
GLOBAL_BATCH_SIZE = 32
NUM_EXAMPLES = 8 * GLOBAL_BATCH_SIZE
EPOCHS = 3
KILL_EPOCH = 1  # 0-based: the second of three epochs.
KILL_STEP = 3


#: How long a stalled worker sleeps: far past any timeout the tests use.
STALL_S = 600


class _KillAt(keras.callbacks.Callback):
    """Kills (or stalls) this process at (KILL_EPOCH, KILL_STEP) when `armed`."""

    def __init__(
        self, armed: bool, out_dir: str, stall: bool = False, victim: str | None = None
    ) -> None:
        super().__init__()
        self._armed = armed
        self._stall = stall
        self._out_dir = out_dir
        self._victim = victim  # A pid file's name in out_dir; None: this process.
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        with open(os.path.join(self._out_dir, f"epochs-begun-{os.getpid()}"), "a") as f:
            f.write(f"{epoch}\n")

    def on_train_batch_end(self, batch, logs=None):
        if self._armed and self._epoch == KILL_EPOCH and batch == KILL_STEP:
            with open(os.path.join(self._out_dir, "killed_at"), "w") as f:
                f.write(repr(time.time()))
            if self._stall:
                time.sleep(STALL_S)
            pid = os.getpid()
            if self._victim is not None:
                self._armed = False
                with open(os.path.join(self._out_dir, self._victim)) as f:
                    pid = int(f.read().split()[-1])  # The latest start's.
            os.kill(pid, signal.SIGKILL)


def _model():
    return tfdist.testing.small_classifier(keras.optimizers.Adam(0.01))


def main(mode: str, out_dir: str, timeout_s: float) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 8)).astype("float32")
    y = rng.integers(0, 3, NUM_EXAMPLES).astype("int32")
    if mode == "reference":
        model = _model()
        model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0)
        np.savez(os.path.join(out_dir, "weights.npz"), *model.get_weights())
        return
    if mode.startswith("ps_"):
        task_env = json.loads(os.environ["TF_CONFIG"])["task"]
        if task_env["type"] == "ps":
            with open(os.path.join(out_dir, f"ps-{task_env['index']}.pid"), "a") as f:
                f.write(f"{os.getpid()}\n")
        # Serves (and never returns) on the worker and ps tasks.
        strategy = tfdist.ParameterServerStrategy(mode="sync", timeout_s=timeout_s)
        killer = "chief:0"
    elif mode.startswith("mesh_"):
        tfdist.simulate_cpu_devices(2)
        strategy = tfdist.MeshStrategy({"batch": 2, "model": 2}, timeout_s=timeout_s)
        killer = "worker:1"
    else:
        # kill, stall, stall_before_build: TF's collectives under the watchdog;
        # the others take the default (shared memory between these tasks).
        grpc = mode in ("kill", "stall", "stall_before_build")
        strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=timeout_s, transport="grpc" if grpc else "auto")
        killer = "worker:1"
    task = strategy.cluster_config.task
    if mode == "stall_before_build" and task.name == "worker:1":
        with open(os.path.join(out_dir, "killed_at"), "w") as f:
            f.write(repr(time.time()))
        time.sleep(STALL_S)
    attempted = os.path.join(out_dir, f"attempted-{task.task_type}-{task.task_id}")
    first_attempt = not os.path.exists(attempted)
    with open(attempted, "a") as f:
        f.write("1\n")
    callbacks = [
        _KillAt(
            task.name == killer and first_attempt,
            out_dir,
            mode.endswith("stall"),
            victim="ps-0.pid" if mode.startswith("ps_") else None,
        )
    ]
    if mode in ("restart", "ps_restart"):
        callbacks.insert(0, keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")))
    try:
        with strategy.scope():
            model = _model()
        model.fit(
            x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=EPOCHS, shuffle=False,
            verbose=0, callbacks=callbacks,
        )
    except Exception as e:  # The fault test records what the survivor saw.
        record = {
            "type": type(e).__name__,
            "is_lost": isinstance(e, tfdist.errors.WorkerUnavailableError),
            "is_timeout": isinstance(e, tfdist.errors.CollectiveTimeoutError)
            and isinstance(e, tf.errors.DeadlineExceededError),
            "task": getattr(e, "task", None),
            "transport": getattr(strategy, "transport", None),
            "message": str(e),
            "raised_at": time.time(),
        }
        with open(os.path.join(out_dir, f"{task.name}.json"), "w") as f:
            json.dump(record, f)
        raise
    if task.name in ("worker:0", "chief:0"):
        np.savez(os.path.join(out_dir, "weights.npz"), *model.get_weights())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 20.0)
