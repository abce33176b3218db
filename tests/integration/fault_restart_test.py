"""No hangs at a job's edges: a restart resumes from its backup; a missing or duplicate worker is named.

Split from fault_test.py (same helpers, imported from there) so that
pytest-xdist, which keeps a file's tests in one process, runs the two
halves side by side. Real processes on 127.0.0.1, each bounded by a hard
kill; timings asserted are the product's contract, not performance.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest
import tensorflow as tf

import tfdist
from tests import forked_script
from tests.front_end import KERAS_3
from tests.integration import fault_lib
from tests.integration import fault_script
from tfdist import errors
from tfdist import launch

pytestmark = [pytest.mark.multiprocess]


class RestartTest(tf.test.TestCase):
    # The test process's front end: Keras 3 in `make test`, tf-keras in
    # `make test-all`'s multi-process tf-keras stage (`model` marker).
    @pytest.mark.model
    def test_restart_with_backup_and_restore_equals_uninterrupted_run(self):
        tf_keras = not KERAS_3
        out_dir = self.create_tempdir().full_path
        result = fault_lib.launch(out_dir, "--restarts", "1", mode="restart", tf_keras=tf_keras)
        self.assertEqual(result.returncode, 0, result.stderr[-5000:])
        self.assertTrue(os.path.exists(os.path.join(out_dir, "killed_at")))
        # Both workers were relaunched at the epoch of the kill, not at 0.
        self.assertCountEqual(
            fault_lib.epochs_begun(out_dir),
            [[0, fault_script.KILL_EPOCH]] * 2 + [[fault_script.KILL_EPOCH, 2]] * 2,
        )
        restarted = fault_lib.weights(os.path.join(out_dir, "weights.npz"))
        uninterrupted = fault_lib.reference_weights(self.create_tempdir().full_path, tf_keras=tf_keras)
        for a, b in zip(restarted, uninterrupted):
            self.assertAllClose(a, b, rtol=fault_lib.FLOAT32_RTOL, atol=fault_lib.FLOAT32_ATOL)


class StartUpTest(tf.test.TestCase):
    def test_worker_never_started_raises_naming_it_within_timeout(self):
        addresses = list(launch.make_local_cluster(launch.JobShape(2)).addresses("worker"))
        code = (
            "import time, tfdist\n"
            "strategy_class = tfdist.MultiWorkerMirroredStrategy  # Imports TF.\n"
            "start = time.time()\n"
            "try:\n"
            "    strategy_class(timeout_s=8)\n"
            "except tfdist.errors.WorkerUnavailableError as e:\n"
            "    print('RESULT', e.task, round(time.time() - start, 1))\n"
            "    print('MESSAGE', e)\n"
        )
        # Forked from a template that imported TF: a fresh interpreter's import is ~4 CPU-s.
        script = self.create_tempfile("never_started.py", code).full_path
        result = forked_script.run(
            [sys.executable, script], fault_lib.env(fault_lib.tf_config(addresses, 0)),
            cwd=os.getcwd(), timeout_s=fault_lib.JOB_LIMIT_S,
        )
        lines = dict(
            line.split(" ", 1) for line in result.stdout.splitlines()
            if line.startswith(("RESULT", "MESSAGE"))
        )
        self.assertIn("RESULT", lines, result.stderr[-3000:])
        task, elapsed = lines["RESULT"].split()
        self.assertEqual(task, "worker:1")
        self.assertLess(float(elapsed), 8 + fault_lib.MARGIN_S)
        self.assertIn("did not accept connections", lines["MESSAGE"])

    def test_second_process_with_the_same_task_index_is_refused(self):
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]
            config = fault_lib.tf_config([f"127.0.0.1:{port}", "127.0.0.1:1"], 0)
            with self.assertRaisesRegex(
                errors.ClusterConfigError, rf"worker:0's address 127.0.0.1:{port} is already in use"
            ):
                tfdist.MultiWorkerMirroredStrategy(config)


if __name__ == "__main__":
    tfdist.testing.main()
