"""Smoke-runs examples/recommender.py as a user would: a 1,000,000-row table split over 2 ps."""

from __future__ import annotations

import os
import subprocess
import sys

from absl.testing import absltest
import pytest

import tfdist
from tests import forked_script
from tests.examples.digits_test import _ROOT
from tests.examples.digits_test import _TIMEOUT_S

pytestmark = pytest.mark.multiprocess

_SCRIPT = os.path.join(_ROOT, "examples", "recommender.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    """`python -u recommender.py --epochs=1 ARGS`, forked as tests/forked_script.py says."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
    return forked_script.run(
        [sys.executable, "-u", _SCRIPT, "--epochs=1", *args], env, cwd=_ROOT, timeout_s=_TIMEOUT_S)


class RecommenderExampleTest(absltest.TestCase):

    def test_in_process_cluster_splits_the_million_row_table_over_both_ps(self):
        # No TF_CONFIG: an in-process cluster of 2 workers and 2 ps.
        result = _run("--steps=3")
        self.assertEqual(result.returncode, 0, msg=result.stderr[-3000:])
        self.assertIn("user_embedding (1000000, 16): 2 shard(s)", result.stdout)
        self.assertIn("rows 0-499,999 on /job:ps/task:0", result.stdout)
        self.assertIn("rows 500,000-999,999 on /job:ps/task:1", result.stdout)
        self.assertRegex(
            result.stdout,
            r"test_accuracy=0\.\d{4} best_possible_accuracy=0\.\d{4} examples_per_second=",
        )

    def test_reads_the_users_own_interactions_file(self):
        path = os.path.join(self.create_tempdir().full_path, "clicks.csv")
        with open(path, "w") as f:
            f.writelines(f"{u},{u % 7},{u % 2}\n" for u in range(200))
        result = _run("--strategy=single", f"--interactions_file={path}",
                      "--num_users=200", "--num_items=7", "--batch_size=20")
        self.assertEqual(result.returncode, 0, msg=result.stderr[-3000:])
        self.assertIn("user_embedding (200, 16): 1 shard(s)", result.stdout)
        self.assertRegex(
            result.stdout, r"test_accuracy=[01]\.\d{4} best_possible_accuracy=unknown"
        )


if __name__ == "__main__":
    tfdist.testing.main()
