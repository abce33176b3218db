"""Faults in a parameter-server job: a worker killed mid-epoch, a ps killed, a job restarted.

Real processes on 127.0.0.1, each job bounded by a hard kill:

- The workers killed (SIGKILL) in the middle of a step, after part of its
  updates reached the ps, under the launcher's rules (a worker is
  restarted alone, the chief carries on): `fit` completes, the step is run
  again, and every example is trained on exactly once per epoch (counted
  on the ps) with exactly one optimizer step per batch, in async and sync
  mode. Without the update gate (`tfdist.parameter_server.update_gate`)
  this failed in every run (4 of 4): the re-run applied the updates the
  cut step had sent again (fit counted 65 steps of 64). An earlier form of
  the test (a worker killed between steps) failed in 2 of 3 runs without
  the step ledger: TF re-queued a step that had finished.
- The same kill with the workers reading from a tf.data service
  (`input_service="chief"`): `fit` completes and no example is trained on
  twice; the batches the killed workers held are lost (6 of 32 in the
  runs seen), as documented.
- A ps killed mid-epoch, in a job of plain processes (no launcher to stop
  the chief): the chief's `fit` raises `WorkerUnavailableError` naming
  ps:0, well before `timeout_s`.
- The same under `tfdist.launch --restarts 1` with
  `keras.callbacks.BackupAndRestore`: the job is relaunched, resumes from
  the last epoch's backup and ends with the weights of an uninterrupted
  one-device run (sync mode, one worker: the same updates).
"""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.integration import fault_lib
from tests.integration import fault_script
from tests.integration import ps_counting
from tfdist import launch

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

fault_lib.SCRIPT = os.path.abspath(fault_script.__file__)
NUM_EXAMPLES = 512
BATCH_SIZE = 16
EPOCHS = 2
STEPS_PER_EPOCH = NUM_EXAMPLES // BATCH_SIZE
#: The example whose first batch stalls its worker mid-step (see `worker_killed_job`).
STALL_ID = 0
#: Longest stall, seconds: the chief kills the workers long before.
STALL_S = 60.0
#: Seconds from the stalled step's counted ids to the kill: the ps tasks
#: finish applying its other updates, and a sync step's other slice ends.
#: (That its ids were counted, the case the test is about, is waited for.)
SETTLE_S = 1.0


def worker_killed_job(out_dir: str, mode: str, input_service: str | None) -> dict[str, object]:
    """Every task's script; the workers are killed in the middle of a step's updates.

    The first step (or sync slice) training on example STALL_ID stalls in
    its backward pass, after its forward pass updated the ps (each
    example's count; under Keras 3 `optimizer.iterations` and the last
    layer's update too) and before the first layer's gradient exists; it
    writes OUT_DIR/stalled first. The chief then kills both workers
    (SIGKILL; they are restarted alone), so the step is cut short with
    part of its updates applied, and TF runs it again on a restarted
    worker. Returns what fit did.
    """
    keras = tf.keras
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if task["type"] == "worker":
        with open(os.path.join(out_dir, f"worker-{task['index']}.pid"), "a") as f:
            f.write(f"{os.getpid()}\n")
    # Async with max_staleness=0: one step in flight, so the stalled step is
    # the only one the kill cuts short (a step killed while its ps applies
    # an update may apply that one twice: see update_gate's limits).
    staleness = 0 if mode == "async" else None
    strategy = tfdist.ParameterServerStrategy(
        mode=mode, max_staleness=staleness, timeout_s=fault_lib.TIMEOUT_S, input_service=input_service
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 6)).astype("float32")
    x[:, 0] = np.arange(NUM_EXAMPLES)  # Each example's id, counted on the ps.
    y = (x[:, 1] > 0).astype("int32")
    marker = os.path.join(out_dir, "stalled")

    class StallOnce(keras.layers.Layer):
        """Identity; the first backward pass through a batch with STALL_ID stalls."""

        def call(self, inputs, training=None):
            hidden, features = inputs
            if not training:
                return hidden
            stall = tf.logical_and(  # Once: a re-run finds the marker.
                tf.reduce_any(tf.equal(features[:, 0], STALL_ID)),
                tf.equal(tf.size(tf.io.matching_files(marker)), 0),
            )

            @tf.custom_gradient
            def identity(h):
                def grad(dy):
                    def wait():
                        with tf.control_dependencies([tf.io.write_file(marker, "stalled")]):
                            start = tf.timestamp()
                        spun = tf.while_loop(
                            lambda now: now < start + STALL_S, lambda now: tf.timestamp(), [start]
                        )
                        with tf.control_dependencies(spun):
                            return tf.identity(dy)

                    return tf.cond(stall, wait, lambda: tf.identity(dy))

                return tf.identity(h), grad

            return identity(hidden)

    class KillWorkersWhenStalled:
        """A thread of the chief's: SIGKILLs both workers once a step stalls."""

        def __init__(self):
            import threading

            self.killed = threading.Event()
            self.counted_before_kill = 0
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

        def _run(self):
            deadline = time.monotonic() + fault_lib.JOB_LIMIT_S
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            # The stalled step's forward update (its ids counted) is on the
            # ps before the kill: the re-run must not count them again.
            while self._stalled_count() < 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            self.counted_before_kill = self._stalled_count()
            time.sleep(SETTLE_S)
            for index in range(2):
                with open(os.path.join(out_dir, f"worker-{index}.pid")) as f:
                    os.kill(int(f.read().split()[0]), signal.SIGKILL)
            self.killed.set()

        def _stalled_count(self):
            return int(counter.counts[STALL_ID].numpy())

    with strategy.scope():
        counter = ps_counting.count_ids(keras, NUM_EXAMPLES)
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(32, activation="relu")(counter(inputs))
        outputs = keras.layers.Dense(2)(StallOnce()([hidden, inputs]))
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(NUM_EXAMPLES).batch(BATCH_SIZE)
    killer = KillWorkersWhenStalled()
    epoch_counts = []

    class CountsPerEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            epoch_counts.append(counter.counts.numpy())

    history = model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=[CountsPerEpoch()])
    return {
        "killed": killer.killed.is_set(),
        "counted_before_kill": killer.counted_before_kill,
        "iterations": int(model.optimizer.iterations.numpy()),
        "counts": counter.counts.numpy().tolist(),
        "counts_per_epoch": [
            (b - a).tolist() for a, b in zip([np.zeros_like(epoch_counts[0])] + epoch_counts, epoch_counts)
        ],
        "steps_rerun": strategy.steps_rerun,
        "steps_rerun_skipped": strategy.steps_rerun_skipped,
        "loss": history.history["loss"],
    }


class WorkerKilledTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(("async", "async"), ("sync", "sync"))
    def test_fit_completes_with_every_step_applied_once(self, mode):
        result = tfdist.testing.run_local_ps_job(
            worker_killed_job, num_workers=2, num_ps=1, timeout_s=fault_lib.JOB_LIMIT_S,
            args=(self.create_tempdir().full_path, mode, None),
        )
        self.assertTrue(result["killed"])
        self.assertGreaterEqual(result["counted_before_kill"], 1)
        self.assertGreaterEqual(result["steps_rerun"], 1)  # At least the stalled step.
        self.assertEqual(result["iterations"], EPOCHS * STEPS_PER_EPOCH)
        miscounted = {i: c for i, c in enumerate(result["counts"]) if c != EPOCHS}
        self.assertEqual(miscounted, {})  # Example id: times trained on.
        self.assertLess(result["loss"][-1], result["loss"][0])


class WorkerKilledInputServiceTest(tf.test.TestCase):

    def test_fit_completes_with_no_example_trained_twice(self):
        # The workers read from the chief's tf.data service: a killed worker
        # loses the batches it had fetched, and TF's re-run of its step
        # reads the next batch (at most once, see service_input).
        result = tfdist.testing.run_local_ps_job(
            worker_killed_job, num_workers=2, num_ps=1, timeout_s=fault_lib.JOB_LIMIT_S,
            args=(self.create_tempdir().full_path, "async", "chief"),
        )
        self.assertTrue(result["killed"])
        self.assertGreaterEqual(result["counted_before_kill"], 1)
        self.assertGreaterEqual(result["steps_rerun"], 1)
        for epoch, counts in enumerate(result["counts_per_epoch"]):
            twice = {i: c for i, c in enumerate(counts) if c > 1}
            self.assertEqual(twice, {}, f"epoch {epoch}")  # Example id: times trained on.
        self.assertLessEqual(result["iterations"], EPOCHS * STEPS_PER_EPOCH)
        self.assertLess(result["loss"][-1], result["loss"][0])


def _run_ps_job_of_processes(out_dir: str) -> dict[str, fault_lib.Task]:
    """Chief + 1 worker + 1 ps running `fault_script ps_kill`, no launcher; by task name."""
    shape = launch.JobShape(1, num_ps=1, has_chief=True)
    cluster = launch.make_local_cluster(shape).to_dict()
    return {
        task.name: fault_lib.Task(
            "ps_kill",
            out_dir,
            json.dumps({"cluster": cluster, "task": {"type": task.task_type, "index": task.task_id}}),
        )
        for task in shape.tasks()
    }


class ParameterServerKilledTest(tf.test.TestCase):

    def test_chief_raises_worker_unavailable_naming_the_ps_in_time(self):
        out_dir = self.create_tempdir().full_path
        procs = _run_ps_job_of_processes(out_dir)
        try:
            procs["chief:0"].wait(timeout=fault_lib.JOB_LIMIT_S)
        finally:
            for proc in procs.values():
                proc.kill()
        self.assertNotEqual(procs["chief:0"].returncode, 0, procs["chief:0"].stderr[-3000:])
        self.assertEqual(procs["ps:0"].returncode, -signal.SIGKILL)
        with open(os.path.join(out_dir, "chief:0.json")) as f:
            record = json.load(f)
        with open(os.path.join(out_dir, "killed_at")) as f:
            killed_at = float(f.read())
        self.assertTrue(record["is_lost"], record)
        self.assertEqual(record["task"], "ps:0")
        self.assertIn("restart the job", record["message"])
        # The ps probe's 2 s, not the timeout; the margin covers a loaded machine.
        self.assertLess(record["raised_at"] - killed_at, fault_lib.TIMEOUT_S)

    def test_launcher_restart_resumes_from_backup_with_uninterrupted_weights(self):
        out_dir = self.create_tempdir().full_path
        started = time.monotonic()
        result = fault_lib.launch(
            out_dir, "--chief", "--workers", "1", "--ps", "1", "--restarts", "1", mode="ps_restart"
        )
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertIn("restart 1/1", result.stderr)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "killed_at")))
        self.assertLess(time.monotonic() - started, fault_lib.JOB_LIMIT_S)
        # The relaunched chief began at the epoch it was killed in, not at 0.
        self.assertCountEqual(
            fault_lib.epochs_begun(out_dir), [[0, fault_script.KILL_EPOCH], [fault_script.KILL_EPOCH, 2]]
        )
        restarted = fault_lib.weights(os.path.join(out_dir, "weights.npz"))
        uninterrupted = fault_lib.reference_weights(self.create_tempdir().full_path)
        for a, b in zip(restarted, uninterrupted):
            self.assertAllClose(a, b, rtol=fault_lib.FLOAT32_RTOL, atol=fault_lib.FLOAT32_ATOL)


if __name__ == "__main__":
    tfdist.testing.main()
