"""Elastic jobs: what a membership change costs, and what keeping state committable costs.

    python benchmarks/elastic.py [--repeats=3] [--tf_keras] [--recovery_only=CASE ...]

Every job runs `tfdist-launch --preload tensorflow` on this machine with
this script as the task program (`--task`), a 32 -> 256 -> 256 -> 10 MLP
under `tfdist.MultiWorkerMirroredStrategy`, 64 steps an epoch of a global
batch of 64, 3 epochs. Each task logs timestamped events (a JSON line each)
that the driver reads after the job.

1. Recovery, phase by phase, from the change to the first step of the
   re-formed cluster:
   - `preempted`: SIGTERM to worker:1 of 2 at step 20 of epoch 1 (the
     launcher relaunches 2 workers): notice -> every task has committed
     at the agreed step -> the tasks have exited -> the new tasks start ->
     state restored -> first step. Steps lost: steps trained after the
     committed one (0 by design).
   - `lost`: worker:2 of `--workers 2:3` SIGKILLs itself at step 20 of
     epoch 1, `Elastic(save_freq=8)`: death -> the survivors' fit raises
     (detect; it includes their saving the last step they kept) -> they
     have exited (stop) -> the new tasks start (re-form) -> restored ->
     first step. Steps lost: steps trained and not resumed from.
   - `lost_from_commit`: the same with `save_on_loss=False`: the job
     resumes from the last commit.
   - `preempted_ps`: the parameter-server job (`--chief --workers 2 --ps 1`,
     `tfdist.ParameterServerStrategy` in async mode): SIGTERM to the chief
     at step 20 of epoch 1 (`--restarts 1`): notice -> the steps in flight
     have finished and the chief has committed -> it has exited -> the
     worker and ps tasks, serving until then, have exited and the new
     chief starts (re-form) -> restored -> first step.
   - `tf_restart`: TF's own way, for comparison: the same loss under
     `tf.distribute.MultiWorkerMirroredStrategy` with Keras's
     `BackupAndRestore` (epoch commits) and `--restarts 1` on 3 workers
     (TF cannot continue on fewer); phases as for `lost`. With
     `--tf_keras` only: TF's strategy cannot run Keras 3's `fit` on several
     workers (its `reduce` of Keras 3's logs fails with "Attempt to
     convert a value (PerReplica...)").
2. Steady state: median step time of a 2-worker job over epochs 1-2 with no
   callback, `Elastic(save_freq=None)` (commits only on a notice; keeps
   each step's state in memory), the same with `save_on_loss=False`, and
   `Elastic(save_freq=16)`; and (`--tf_keras`) Keras's
   `BackupAndRestore(save_freq=16)` under TF's strategy against TF's
   strategy alone. Runs interleaved.
3. Per-step cost, resolved finer than 2 can: in this process, one device
   (`tfdist.MirroredStrategy`), the same MLP, 2 epochs of 400 steps each
   without a callback, with a callback whose `on_train_batch_end` does
   nothing, with `Elastic(save_freq=None)`, and with that and what
   `save_on_loss` adds on several tasks (`LastStep.keep` at each step end,
   at its default `COST_SHARE` and keeping every step; one process keeps
   nothing by itself); interleaved, median of `--repeats`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app
from absl import flags

_REPEATS = flags.DEFINE_integer("repeats", 3, "Runs of each case.", lower_bound=1)
_TF_KERAS = flags.DEFINE_bool("tf_keras", False, "Run under tf-keras, with TF's strategy's cases.")
_RECOVERY_ONLY = flags.DEFINE_multi_enum(
    "recovery_only", [], ["preempted", "preempted_ps", "lost", "lost_from_commit", "tf_restart"],
    "Measure only these recovery cases (no steady state).")
_IN_PROCESS_ONLY = flags.DEFINE_bool("in_process_only", False, "Run part 3 only.")
_TASK = flags.DEFINE_string("task", None, "Run as a task of CASE in OUT_DIR (internal): CASE,OUT_DIR.")

STEPS = 64
BATCH = 64
EPOCHS = 3
CHANGE_EPOCH, CHANGE_STEP = 1, 20
COMMIT_STEPS = 8


def _task(case: str, out_dir: str) -> None:
    """One task of a job (run by tfdist-launch)."""
    import tensorflow as tf

    import tfdist

    keras = tf.keras
    tf_strategy = case.startswith("tf")
    if case.endswith("_ps"):  # Serves on worker and ps tasks: only the chief goes on.
        strategy = tfdist.ParameterServerStrategy(timeout_s=60)
    elif tf_strategy:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=60)
    if tf_strategy:
        resolver = strategy.cluster_resolver
        task = f"{resolver.task_type}:{resolver.task_id}"
        num_workers = len(resolver.cluster_spec().as_dict().get("worker", []))
    else:
        config = strategy.cluster_config
        task = config.task.name
        num_workers = len(config.cluster.addresses("worker"))
    marker = os.path.join(out_dir, "changed")
    first_attempt = not os.path.exists(marker)
    events = open(os.path.join(out_dir, f"events-{os.getpid()}.jsonl"), "a")

    def log(event: str, **fields: object) -> None:
        events.write(json.dumps({"event": event, "t": time.time(), "task": task,
                                 "workers": num_workers, **fields}) + "\n")
        events.flush()

    log("start")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, 32)).astype("float32")
    y = rng.integers(0, 10, STEPS * BATCH).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10),
        ])
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    backup = os.path.join(out_dir, "backup")
    callbacks: list = []
    if case in ("elastic", "preempted", "preempted_ps"):
        callbacks.append(tfdist.elastic.Elastic(backup, save_freq=None))
    elif case == "elastic_keep_nothing":
        callbacks.append(tfdist.elastic.Elastic(backup, save_freq=None, save_on_loss=False))
    elif case in ("elastic_commits", "lost", "lost_from_commit"):
        callbacks.append(tfdist.elastic.Elastic(
            backup, save_freq=16 if case == "elastic_commits" else COMMIT_STEPS,
            save_on_loss=case != "lost_from_commit"))
    elif case in ("tf_backup", "tf_restart"):
        callbacks.append(keras.callbacks.BackupAndRestore(backup, save_freq="epoch" if case == "tf_restart" else 16))

    class Events(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            log("restored")

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            log("step", epoch=self.epoch, batch=batch)
            if not first_attempt or (self.epoch, batch) != (CHANGE_EPOCH, CHANGE_STEP):
                return
            if (case, task) in (("preempted", "worker:1"), ("preempted_ps", "chief:0")):
                open(marker, "w").close()
                log("change")
                os.kill(os.getpid(), signal.SIGTERM)
            elif case in ("lost", "lost_from_commit", "tf_restart") and task == f"worker:{num_workers - 1}":
                open(marker, "w").close()
                log("change")
                os.kill(os.getpid(), signal.SIGKILL)

    try:
        # Events first: it logs every step before Elastic may stop at it.
        model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=[Events(), *callbacks])
    except tfdist.errors.TrainingPreempted as e:
        log("committed", epoch=e.epoch, step=e.step)
        raise
    except Exception as e:
        log("raised", error=type(e).__name__)
        raise
    finally:
        log("exit")


def _run_job(case: str, workers: str, *extra: str) -> tuple[list[dict], list[tuple[float, str]], float]:
    """Runs one job; its tasks' events and the launcher's timestamped lines."""
    out_dir = tempfile.mkdtemp(prefix=f"tfdist-elastic-{case}-")
    env = dict(os.environ, TF_NUM_INTEROP_THREADS="3", TF_NUM_INTRAOP_THREADS="1",
               TF_USE_LEGACY_KERAS="1" if _TF_KERAS.value else "0")
    command = [sys.executable, "-m", "tfdist.launch", "--preload", "tensorflow",
               "--workers", workers, *extra, "--",
               sys.executable, os.path.abspath(__file__), f"--task={case},{out_dir}"]
    started = time.time()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    lines = []
    assert process.stderr is not None
    for line in process.stderr:
        if line.startswith("tfdist-launch:") or "tfdist.elastic: resumed from" in line:
            lines.append((time.time(), line.strip()))
    if process.wait() != 0:
        raise RuntimeError(f"{case} exited {process.returncode}: {lines}")
    events = []
    for path in glob.glob(os.path.join(out_dir, "events-*.jsonl")):
        with open(path) as f:
            events += [json.loads(line) for line in f]
    return sorted(events, key=lambda e: e["t"]), lines, time.time() - started


def _phases(case: str, events: list[dict], lines: list[tuple[float, str]]) -> dict[str, float]:
    change = next(e for e in events if e["event"] == "change")["t"]
    second = [e for e in events if e["t"] > change and e["event"] == "start"]
    first_start = min(e["t"] for e in second)
    restored = max(e["t"] for e in events if e["event"] == "restored" and e["t"] > change)
    first_step = min(e["t"] for e in events if e["event"] == "step" and e["t"] > restored)
    exited = max(e["t"] for e in events if e["event"] == "exit" and change <= e["t"] < first_start)
    phases = {}
    if case.startswith("preempted"):
        committed = max(e["t"] for e in events if e["event"] == "committed")
        phases["agree+commit"] = committed - change
        phases["exit"] = exited - committed
    else:
        detected = min(e["t"] for e in events if e["event"] == "raised")
        phases["detect"] = detected - change
        phases["stop"] = exited - detected
    phases["re-form"] = first_start - exited
    phases["restore"] = restored - first_start
    phases["first step"] = first_step - restored
    phases["total"] = first_step - change
    # Steps trained in the first attempt and not kept: those after the
    # position the second attempt resumed at (Keras's own epoch start for
    # TF's BackupAndRestore; tfdist.elastic logs where it resumed).
    last_done = max(e["epoch"] * STEPS + e["batch"] + 1 for e in events
                    if e["event"] == "step" and e["t"] < first_start)
    resumed = [re.search(r"epoch (\d+), step (\d+)", text) for _, text in lines]
    found = [m for m in resumed if m is not None]
    if found:
        position = int(found[0].group(1)) * STEPS + int(found[0].group(2))
    else:
        first_epoch = min(e["epoch"] for e in events if e["event"] == "step" and e["t"] > first_start)
        position = first_epoch * STEPS
    phases["steps lost"] = last_done - position
    return phases


def _step_ms(events: list[dict]) -> float:
    """Median step time of worker:0 over epochs 1 and 2 (epoch 0 traces)."""
    steps = [e["t"] for e in events if e["event"] == "step" and e["task"] == "worker:0" and e["epoch"] >= 1]
    return float(np.median(np.diff(steps)) * 1000)


def _in_process_step_ms(repeats: int) -> dict[str, list[float]]:
    """Part 3: milliseconds per step in this process, per case."""
    import tensorflow as tf

    import tfdist
    from tfdist.elastic import last_step
    from tfdist.elastic import training_state

    keras = tf.keras
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * 400, 32)).astype("float32")
    y = rng.integers(0, 10, BATCH * 400).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    strategy = tfdist.MirroredStrategy()

    class NoOp(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            del batch, logs

    class KeepLastStep(keras.callbacks.Callback):
        """What `save_on_loss` adds at each step end on several tasks, with a `COST_SHARE`."""

        def __init__(self, share):
            super().__init__()
            self.share = share

        def on_train_batch_end(self, batch, logs=None):
            default, last_step.COST_SHARE = last_step.COST_SHARE, self.share
            try:
                # Made once per model, in the untimed fit that traces (Elastic makes
                # one per fit: its tracing, ~50 ms, is a fit's cost, not a step's).
                if self.model not in keepers:
                    keepers[self.model] = last_step.LastStep(training_state.variables(self.model), strategy)
                keepers[self.model].keep(training_state.Position(epoch=0, step=batch + 1))
            finally:
                last_step.COST_SHARE = default

    keepers: dict = {}

    cases = {
        "none": lambda: [],
        "no-op batch-end callback": lambda: [NoOp()],
        "Elastic(save_freq=None)": lambda: [tfdist.elastic.Elastic(tempfile.mkdtemp(), save_freq=None)],
        "Elastic + keeping (1% share)": lambda: [
            tfdist.elastic.Elastic(tempfile.mkdtemp(), save_freq=None), KeepLastStep(last_step.COST_SHARE)],
        "Elastic + keeping every step": lambda: [
            tfdist.elastic.Elastic(tempfile.mkdtemp(), save_freq=None), KeepLastStep(1.0)],
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, callbacks in cases.items():
            with strategy.scope():
                keras.utils.set_random_seed(1)
                model = keras.Sequential([
                    keras.Input((32,)), keras.layers.Dense(256, activation="relu"),
                    keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10),
                ])
                model.compile(keras.optimizers.SGD(0.01),
                              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(dataset, epochs=1, verbose=0, callbacks=callbacks())  # Traces.
            started = time.perf_counter()
            model.fit(dataset, epochs=2, verbose=0, callbacks=callbacks())
            times[name].append((time.perf_counter() - started) / 800 * 1000)
    return times


def _print_in_process(in_process: dict[str, list[float]]) -> None:
    print("in this process, one device, ms per step (median of runs):")
    for name, values in in_process.items():
        print(f"  {name:30s} {np.median(values):.3f}  runs {', '.join(f'{v:.3f}' for v in values)}")
    none = np.median(in_process["none"])
    print(f"  Elastic / none: {np.median(in_process['Elastic(save_freq=None)']) / none:.3f}")
    for name in ("Elastic + keeping (1% share)", "Elastic + keeping every step"):
        print(f"  {name} / none: {np.median(in_process[name]) / none:.3f}")


def main(argv: list[str]) -> None:
    del argv
    if _TASK.value:
        case, out_dir = _TASK.value.split(",", 1)
        _task(case, out_dir)
        return
    tf_cases = _TF_KERAS.value
    if _IN_PROCESS_ONLY.value:
        in_process = _in_process_step_ms(_REPEATS.value)
        _print_in_process(in_process)
        return
    recoveries: dict[str, list[dict[str, float]]] = {"preempted": [], "preempted_ps": [], "lost": [], "lost_from_commit": []}
    steady: dict[str, list[float]] = {
        c: [] for c in ("none", "elastic", "elastic_keep_nothing", "elastic_commits")}
    if tf_cases:
        recoveries["tf_restart"] = []
        steady.update(tf_none=[], tf_backup=[])
    if _RECOVERY_ONLY.value:
        recoveries = {case: [] for case in _RECOVERY_ONLY.value}
        steady = {}
    jobs = {"preempted": ("2", "--restarts", "1"), "lost": ("2:3", "--restarts", "1"),
            "lost_from_commit": ("2:3", "--restarts", "1"),
            "preempted_ps": ("2", "--chief", "--ps", "1", "--restarts", "1"),
            "tf_restart": ("3", "--restarts", "1")}
    for _ in range(_REPEATS.value):
        for case in recoveries:
            workers, *extra = jobs[case]
            events, lines, _ = _run_job(case, workers, *extra)
            recoveries[case].append(_phases(case, events, lines))
        for case in steady:
            events, _, _ = _run_job(case, "2")
            steady[case].append(_step_ms(events))
    print("recovery (median of runs; seconds, steps):")
    for case, runs in recoveries.items():
        keys = list(runs[0])
        print(f"  {case:11s} " + "  ".join(f"{k} {np.median([r[k] for r in runs]):.2f}" for k in keys))
    if not steady:
        return
    print("steady state, median step ms (median of runs):")
    for case, values in steady.items():
        print(f"  {case:16s} {np.median(values):.2f}  runs {', '.join(f'{v:.2f}' for v in values)}")
    base = np.median(steady["none"])
    print(f"  Elastic(save_freq=None) / none: {np.median(steady['elastic']) / base:.3f}")
    print(f"  Elastic(save_freq=None, save_on_loss=False) / none: "
          f"{np.median(steady['elastic_keep_nothing']) / base:.3f}")
    _print_in_process(_in_process_step_ms(_REPEATS.value))
    print(f"  Elastic(save_freq=16) / none: {np.median(steady['elastic_commits']) / base:.3f}")
    if tf_cases:
        tf_base = np.median(steady["tf_none"])
        print(f"  BackupAndRestore(save_freq=16) / none under TF's strategy: "
              f"{np.median(steady['tf_backup']) / tf_base:.3f}")
        print(f"  tfdist none / TF none (step time): {base / tf_base:.3f}")


if __name__ == "__main__":
    app.run(main)
