"""Elastic jobs with real processes: preemption saves at a step, and the job resumes there on any worker count.

Each test launches `elastic_script.py` (a counting classifier under
tfdist.MultiWorkerMirroredStrategy, or MeshStrategy, or
ParameterServerStrategy, with tfdist.elastic.Elastic) with
`tfdist-launch` on 127.0.0.1, and compares the final weights with one
process training uninterrupted on one device (same global batches), and
the examples the final model counted (a weight, restored across attempts)
with exactly once per epoch. Every
job is bounded by a hard kill. Runs the first test under Keras 3 and
tf-keras, the others under Keras 3.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from absl.testing import parameterized
import tensorflow as tf

import tfdist
from tests import forked_script
from tests.front_end import KERAS_3
from tests.integration import elastic_script as job
from tests.integration import fault_lib
from tests.unit.launch import programs

pytestmark = [pytest.mark.multiprocess]

SCRIPT = os.path.abspath(job.__file__)
_TWO_WORKERS = ("--workers", "2")
_PS_JOB = ("--chief", "--workers", "1", "--ps", "1")


def _command(out_dir, mode, *launcher_args):
    return [
        sys.executable, "-m", "tfdist.launch", "--preload", "tensorflow", *launcher_args,
        "--", sys.executable, SCRIPT, mode, out_dir,
    ]


def _launch(out_dir, mode, *launcher_args, tf_keras=False):
    return subprocess.run(
        _command(out_dir, mode, *launcher_args), env=fault_lib.env(tf_keras=tf_keras),
        capture_output=True, text=True, timeout=fault_lib.JOB_LIMIT_S,
    )


@functools.cache
def _reference(tf_keras):
    """Final weights of one process training uninterrupted on one device."""
    out_dir = tempfile.mkdtemp(prefix="tfdist-elastic-reference-")
    result = forked_script.run(
        [sys.executable, SCRIPT, "reference", out_dir], fault_lib.env(tf_keras=tf_keras),
        cwd=os.getcwd(), timeout_s=fault_lib.JOB_LIMIT_S,
    )
    if result.returncode != 0:
        raise AssertionError(f"the reference run exited {result.returncode}:\n{result.stderr[-3000:]}")
    return fault_lib.weights(os.path.join(out_dir, "weights.npz"))


def _wait_for(out_dir, prefix, count, process):
    deadline = time.monotonic() + fault_lib.JOB_LIMIT_S
    while len(glob.glob(os.path.join(out_dir, prefix + "*"))) < count:
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {count} {prefix}* files; the launcher's output:\n"
                                 + process.communicate()[1][-5000:])
        time.sleep(0.05)


class ElasticJobTest(tf.test.TestCase, parameterized.TestCase):
    def assert_equals_uninterrupted(self, out_dir, tf_keras=False):
        for a, b in zip(fault_lib.weights(os.path.join(out_dir, "weights.npz")), _reference(tf_keras)):
            self.assertAllClose(a, b, rtol=fault_lib.FLOAT32_RTOL, atol=fault_lib.FLOAT32_ATOL)

    def assert_each_example_once_per_epoch(self, out_dir):
        # The model's counts (its first weight) cover every attempt.
        counts = fault_lib.weights(os.path.join(out_dir, "weights.npz"))[0]
        self.assertAllEqual(counts, np.full(job.NUM_EXAMPLES, job.EPOCHS))

    def saved_positions(self, out_dir):
        positions = set()
        for path in glob.glob(os.path.join(out_dir, "preempted-*.json")):
            with open(path) as f:
                record = json.load(f)
            positions.add((record["epoch"], record["step"]))
        return positions

    # The test process's front end: Keras 3 in `make test`, tf-keras in
    # `make test-all`'s multi-process tf-keras stage (`model` marker).
    # On a 2x2 mesh (TF's DTensor in multi-client mode) as well: the tasks
    # agree on the step there too, and worker 0 writes the state.
    # The parameter-server job: a chief, whose loop runs ahead of the steps
    # it queues on the one worker, and a ps task.
    @pytest.mark.model
    @parameterized.named_parameters(
        ("multi_worker", "self_sigterm", _TWO_WORKERS, "worker"),
        ("mesh", "self_sigterm_mesh", _TWO_WORKERS, "worker"),
        ("parameter_server", "self_sigterm_ps", _PS_JOB, "chief"),
    )
    def test_sigterm_to_one_task_stops_every_task_at_one_step_and_the_restart_resumes_there(
            self, mode, tasks, training_job):
        tf_keras = not KERAS_3
        out_dir = self.create_tempdir().full_path
        result = _launch(out_dir, mode, *tasks, "--restarts", "1", tf_keras=tf_keras)
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        # The first training task to exit after its commit ends the attempt.
        self.assertRegex(result.stderr, rf"restart 1/1: task {training_job}:\d exited with code 143")
        # Every training task saved at the same step of the signal's epoch, not at its end.
        (position,) = self.saved_positions(out_dir)
        self.assertEqual(position[0], job.SIGNAL_EPOCH)
        self.assertGreater(position[1], job.SIGNAL_STEP)
        self.assertLess(position[1], job.STEPS_PER_EPOCH)
        self.assertLen(glob.glob(os.path.join(out_dir, "preempted-*.json")), 1 if training_job == "chief" else 2)
        self.assert_each_example_once_per_epoch(out_dir)
        self.assert_equals_uninterrupted(out_dir, tf_keras)

    # A parameter-server job's worker and ps tasks get the launcher's SIGTERM
    # too, and must serve until the chief has saved from them. In `make
    # test-all` (`extended`): `make test` takes its paths in the test below
    # (a ps task serving on after SIGTERM until the chief has saved), in
    # serving_task_test (a worker or ps task's serve-on) and in the
    # multi-worker tests of the launcher's SIGTERM.
    @pytest.mark.extended
    def test_sigterm_to_the_launcher_exits_143_and_a_rerun_resumes_at_the_step_parameter_server(self):
        self.check_sigterm_to_the_launcher("wait_for_sigterm_ps", _PS_JOB, _PS_JOB)

    # A notice to the ps task alone (Kubernetes evicting its pod): the ps
    # serves on and posts it, the chief finds it at a step end, saves there
    # and exits 143; the restart resumes at that step. Without the post the
    # ps would serve on unnoticed, the chief would finish, nothing saved.
    def test_sigterm_to_a_ps_task_alone_stops_the_chief_at_a_step_and_the_restart_resumes_there(self):
        out_dir = self.create_tempdir().full_path
        launcher = subprocess.Popen(
            _command(out_dir, "wait_for_sigterm_ps", *_PS_JOB, "--restarts", "1"), env=fault_lib.env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            _wait_for(out_dir, "reached-", 1, launcher)
            with open(os.path.join(out_dir, "pid-ps-0")) as f:
                os.kill(int(f.read()), signal.SIGTERM)
            _, stderr = launcher.communicate(timeout=fault_lib.JOB_LIMIT_S)
        finally:
            launcher.kill()
        self.assertEqual(launcher.returncode, 0, stderr[-5000:])
        self.assertIn("task ps:0 received a preemption notice; the chief stops at this step", stderr)
        self.assertIn("restart 1/1: task chief:0 exited with code 143", stderr)
        ((epoch, step),) = self.saved_positions(out_dir)
        self.assertEqual(epoch, job.SIGNAL_EPOCH)
        self.assertGreater(step, job.SIGNAL_STEP)
        self.assert_each_example_once_per_epoch(out_dir)
        self.assert_equals_uninterrupted(out_dir)

    # In `make test-all` (`extended`): `make test` takes its paths in the
    # tests above and below (the launcher's SIGTERM to every task, the
    # agreement across workers, a resume on another number of workers).
    @pytest.mark.extended
    def test_sigterm_to_the_launcher_exits_143_and_a_rerun_resumes_at_the_step_multi_worker(self):
        self.check_sigterm_to_the_launcher("wait_for_sigterm", _TWO_WORKERS, ("--workers", "1"))

    def check_sigterm_to_the_launcher(self, mode, tasks, rerun_tasks):
        out_dir = self.create_tempdir().full_path
        launcher = subprocess.Popen(
            _command(out_dir, mode, *tasks), env=fault_lib.env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            _wait_for(out_dir, "reached-", 1 if mode.endswith("_ps") else 2, launcher)
            launcher.send_signal(signal.SIGTERM)
            _, stderr = launcher.communicate(timeout=fault_lib.JOB_LIMIT_S)
        finally:
            launcher.kill()
        self.assertEqual(launcher.returncode, 143, stderr[-5000:])
        self.assertNotIn("ignored it and", stderr)  # No task needed SIGKILL.
        ((epoch, step),) = self.saved_positions(out_dir)
        self.assertEqual(epoch, job.SIGNAL_EPOCH)
        self.assertGreater(step, 0)

        # Multi-worker on one worker: the rest of the epoch's global batches, all its own.
        rerun = _launch(out_dir, mode, *rerun_tasks)
        self.assertEqual(rerun.returncode, 0, rerun.stderr[-5000:])
        self.assertIn("tfdist.elastic: resumed from", rerun.stderr)
        self.assert_each_example_once_per_epoch(out_dir)
        self.assert_equals_uninterrupted(out_dir)

    # The survivor saves the state of the step it ended last (the killed
    # worker's last), one step past the last commit (`save_freq`), and the
    # job resumes there.
    def test_a_killed_worker_shrinks_the_job_which_resumes_at_the_step_of_the_loss(self):
        self.check_killed_worker("kill", "survivor-worker-0", job.SIGNAL_STEP + 1)

    # Without it (`save_on_loss=False`), at the commit, training the steps
    # since again: what the test above fails on without the survivor's save.
    # In `make test-all` (`extended`).
    @pytest.mark.extended
    def test_a_killed_worker_shrinks_the_job_which_resumes_at_the_last_commit_without_save_on_loss(self):
        self.check_killed_worker("kill_keep_nothing", "state-", job.SIGNAL_STEP)

    def check_killed_worker(self, mode, state, step):
        out_dir = self.create_tempdir().full_path
        result = _launch(out_dir, mode, "--workers", "1:2", "--restarts", "1")
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertIn("membership: 2 -> 1 worker(s): task worker:1 was killed by SIGKILL", result.stderr)
        self.assertIn("tfdist-launch: all 1 chief/worker task(s) exited 0", result.stderr)
        self.assertRegex(
            result.stderr, rf"resumed from \S*/{state}\S* in [\d.]+ s: epoch {job.SIGNAL_EPOCH}, step {step}\."
        )
        self.assert_each_example_once_per_epoch(out_dir)
        self.assert_equals_uninterrupted(out_dir)

    def test_a_slot_added_grows_the_job_at_a_step(self):
        # 2 -> 3 workers: the global batch of 16 is then split 6/5/5.
        out_dir = self.create_tempdir().full_path
        slots = os.path.join(out_dir, "slots")
        stderr = self._grow(out_dir, slots, "2", "3", _command(
            out_dir, "wait_for_sigterm", "--workers", "1:3", "--slots-file", slots))
        self.assertIn(f"membership: 2 -> 3 worker(s): the slots file {slots!r} asked for 3", stderr)

    # In `make test-all` (`extended`): the same job as the slots file's, its
    # tasks started through a remote shell (a stand-in for ssh, on 127.0.0.1).
    @pytest.mark.extended
    def test_a_host_added_grows_the_job_at_a_step(self):
        out_dir = self.create_tempdir().full_path
        hosts = os.path.join(out_dir, "hosts")
        command = [
            sys.executable, "-m", "tfdist.launch", "--workers", "1:3", "--hosts-file", hosts,
            "--rsh", shlex.join(programs.FAKE_RSH), "--port", str(programs.free_port_block(3)),
            "--", sys.executable, SCRIPT, "wait_for_sigterm", out_dir,
        ]
        stderr = self._grow(out_dir, hosts, "127.0.0.1 slots=2\n", "127.0.0.1 slots=3\n", command)
        self.assertIn(f"membership: 2 -> 3 worker(s): the hosts file {hosts!r} changed", stderr)

    # In `make test-all` (`extended`): the slots file's path, which a
    # parameter-server job takes too; sync mode, whose update is one device's
    # whatever the number of workers.
    @pytest.mark.extended
    def test_a_slot_added_grows_a_parameter_server_job_at_a_step(self):
        out_dir = self.create_tempdir().full_path
        slots = os.path.join(out_dir, "slots")
        stderr = self._grow(out_dir, slots, "1", "2", _command(
            out_dir, "wait_for_sigterm_ps_sync", "--chief", "--workers", "1:2", "--ps", "1",
            "--slots-file", slots), reached=1, tasks="the chief")
        self.assertIn(f"membership: 1 -> 2 worker(s): the slots file {slots!r} asked for 2", stderr)

    def _grow(self, out_dir, path, before, after, command, reached=2, tasks="all 3 chief/worker task(s)"):
        """Runs `command` with `before` in `path`, writes `after` once 2 workers run; returns its stderr."""
        with open(path, "w") as f:
            f.write(before)
        launcher = subprocess.Popen(
            command, env=fault_lib.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            _wait_for(out_dir, "reached-", reached, launcher)
            with open(path, "w") as f:
                f.write(after)
            _, stderr = launcher.communicate(timeout=fault_lib.JOB_LIMIT_S)
        finally:
            launcher.kill()
        self.assertEqual(launcher.returncode, 0, stderr[-5000:])
        self.assertIn(f"{tasks} exited 0", stderr)
        self.assertLen(self.saved_positions(out_dir), 1)
        self.assert_each_example_once_per_epoch(out_dir)
        self.assert_equals_uninterrupted(out_dir)
        return stderr

if __name__ == "__main__":
    tfdist.testing.main()
