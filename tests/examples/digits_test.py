"""Smoke-runs examples/digits.py as a user would, with --steps=2."""

from __future__ import annotations

import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import pytest

import tfdist
from tests import forked_script
from tests.front_end import KERAS_3
from tests.front_end import TF_CONTENDER
from tfdist import launch  # noqa: F401 - run as `python -m tfdist.launch`; Bazel ships it

pytestmark = pytest.mark.multiprocess

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPT = os.path.join(_ROOT, "examples", "digits.py")
_TIMEOUT_S = 240


def _run(args, *, launcher_args=None, extra_env=None):
    """`python -u digits.py --epochs=1 --steps=2 ARGS` (under the launcher if `launcher_args`)."""
    command = [sys.executable, "-u", _SCRIPT, "--epochs=1", "--steps=2", *args]
    # This checkout's tfdist, not whichever one is installed (a worktree's
    # venv may hold another checkout's editable install).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [_ROOT, os.environ.get("PYTHONPATH")])), **(extra_env or {}))
    if launcher_args is None:
        # Forked from a process that imported TensorFlow, then run as
        # `python digits.py` would be (tests/forked_script.py).
        return forked_script.run(command, env, cwd=_ROOT, timeout_s=_TIMEOUT_S)
    # Each task forked from one process that imported TensorFlow.
    command = [sys.executable, "-m", "tfdist.launch", "--preload", "tensorflow",
               *launcher_args, "--", *command]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=_TIMEOUT_S, cwd=_ROOT, env=env)


class DigitsExampleTest(parameterized.TestCase):

    @parameterized.named_parameters(
        {"testcase_name": "tfdist_mirrored_ring", "args": ["--all_reduce=ring"], "replicas": 4},
        {"testcase_name": "tf_builtin_mirrored", "args": ["--strategy=tf_mirrored"], "replicas": 4},
        {"testcase_name": "single_device", "args": ["--strategy=single"], "replicas": 1},
        # No TF_CONFIG: an in-process cluster of 2 workers and 2 ps (with the
        # chief's tf.data service: tests/integration/in_process_exposure_test.py).
        {"testcase_name": "parameter_server_in_process",
         "args": ["--strategy=parameter_server"], "replicas": 1},
    )
    def test_runs_and_reports_accuracy_and_throughput(self, args, replicas):
        if "--strategy=tf_mirrored" in args and not TF_CONTENDER:
            self.skipTest(
                "runs TF's own MirroredStrategy, left out of this run (TFDIST_TEST_TF_CONTENDER=0, "
                "as in `make test`); `make test-all` runs it")
        result = _run(args)
        self.assertEqual(result.returncode, 0, msg=result.stderr[-3000:])
        self.assertRegex(result.stdout, r"test_accuracy=0\.\d{4} examples_per_second=")
        self.assertIn(f"replicas={replicas}", result.stdout)

    def test_layer_placement_prints_the_placement_report(self):
        result = _run(["--strategy=layer_placement", "--num_microbatches=2",
                       "--data_parallel=2", "--model=deep_mlp"])
        self.assertEqual(result.returncode, 0, msg=result.stderr[-3000:])
        self.assertRegex(result.stdout, r"test_accuracy=0\.\d{4} examples_per_second=")
        self.assertIn("replicas=1", result.stdout)
        # 9 layers over two copies of a 2-stage pipeline: M = 2, bubble 1/3.
        self.assertRegex(result.stdout, r"2 stage\(s\), balance_by='params', num_microbatches=2 \(GPipe bubble 33%")
        self.assertIn("2 copies of the pipeline (data parallel), stage devices: "
                      "/device:CPU:0, /device:CPU:1; /device:CPU:2, /device:CPU:3", result.stdout)
        for stage in range(2):
            self.assertRegex(result.stdout, rf"\n  dense\S*  +/device:CPU:{stage}  stage {stage}\n")

    def test_mesh_prints_the_layout_report(self):
        result = _run(["--strategy=mesh", "--mesh=2x2"], extra_env={"TF_USE_LEGACY_KERAS": "0"})
        self.assertEqual(result.returncode, 0, msg=result.stderr[-3000:])
        self.assertRegex(result.stdout, r"test_accuracy=0\.\d{4} examples_per_second=")
        # Megatron's pair: the first hidden layer by output columns, the second by input rows.
        self.assertRegex(result.stdout, r"dense_hidden_0/kernel \| \(64, 128\) \| \(None, 'model'\) \| 16384")
        self.assertRegex(result.stdout, r"dense_hidden_1/kernel \| \(128, 64\) \| \('model', None\) \| 16384")
        self.assertIn("Mesh batch=2 x model=2", result.stdout)

    def test_multi_worker_runs_under_the_launcher(self):
        model_dir = self.create_tempdir().full_path
        result = _run(
            ["--strategy=multi_worker", "--compression=fp16", f"--model_dir={model_dir}"],
            launcher_args=["--workers", "2", "--timeout-s", "200"],
        )
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, msg=output[-3000:])
        for task in ("worker:0", "worker:1"):
            self.assertRegex(output, rf"\[{task}\] test_accuracy=0\.\d{{4}}")
        self.assertIn("replicas=2", output)
        # tfdist shards the dataset itself: TF's auto-shard warning ("AUTO
        # sharding policy will apply DATA sharding policy ... unshardable
        # source dataset") must not appear.
        self.assertNotIn("sharding policy", output)
        self.assertNotIn("unshardable", output)
        # One writer for the weights: the chief (two h5 writers on one path
        # fail or corrupt the file). The backup is deleted after training
        # (tf-keras leaves its directory, empty).
        backup = os.path.join(model_dir, "backup")
        if os.path.isdir(backup):
            self.assertEqual(os.listdir(backup), [])
        self.assertEqual(sorted(set(os.listdir(model_dir)) - {"backup"}), ["digits.weights.h5"])
        self.assertIn("[worker:0] saved weights to", output)
        self.assertNotIn("[worker:1] saved weights", output)

    # The test process's front end: Keras 3 in `make test`, tf-keras in
    # `make test-all`'s multi-process tf-keras stage (`model` marker).
    @pytest.mark.model
    def test_parameter_server_runs_under_the_launcher(self):
        # The same script on every task: worker and ps tasks serve inside
        # the strategy's constructor; the chief trains and its exit ends
        # the job.
        result = _run(
            ["--strategy=parameter_server"],
            launcher_args=["--chief", "--workers", "2", "--ps", "2", "--timeout-s", "200"],
            extra_env={"TF_USE_LEGACY_KERAS": "0" if KERAS_3 else "1"},
        )
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 0, msg=output[-3000:])
        self.assertRegex(output, r"\[chief:0\] test_accuracy=0\.\d{4}")
        self.assertEqual(output.count("test_accuracy="), 1, msg=output[-3000:])
        self.assertIn("the chief exited 0", output)

    @parameterized.named_parameters(
        ("all_reduce", "--all_reduce=butterfly", "butterfly"),
        ("num_microbatches", "--num_microbatches=0", "num_microbatches"),
    )
    def test_bad_flag_fails_at_parse_time(self, flag, named):
        result = _run([flag])
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(named, result.stderr)


if __name__ == "__main__":
    tfdist.testing.main()
