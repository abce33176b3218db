"""Tests for tfdist.launch.restart: relaunching a whole job after failures."""

from __future__ import annotations

import io
import os
import re

from absl.testing import absltest

from tests.unit.launch import programs
from tfdist import errors
from tfdist.launch import job
from tfdist.launch import restart


class RunLocalJobTest(absltest.TestCase):
    def test_restart_relaunches_on_fresh_ports_after_failure(self):
        marker = os.path.join(self.create_tempdir().full_path, "failed-once")
        # worker:1 fails the first time only; worker:0 always succeeds.
        code = programs.by_task({"worker:1": programs.FAIL_ONCE})
        err = io.StringIO()

        result = restart.run_local_job(
            programs.python(code, marker),
            job.JobShape(2),
            env=dict(os.environ),
            restarts=1,
            timeout_s=programs.JOB_BOUND_S,
            stdout=io.StringIO(),
            stderr=err,
        )

        self.assertTrue(result.succeeded)
        log = err.getvalue()
        self.assertIn("restart 1/1: task worker:1 exited with code 3", log)
        starts = re.findall(r"starting 2 task\(s\).*: (.*)", log)
        self.assertLen(starts, 2)
        self.assertNotEqual(starts[0], starts[1])

    def test_failure_after_every_restart_returns_failed(self):
        err = io.StringIO()

        result = restart.run_local_job(
            programs.python("raise SystemExit(5)"),
            job.JobShape(1),
            env=dict(os.environ),
            restarts=2,
            timeout_s=programs.JOB_BOUND_S,
            stderr=err,
        )

        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual(result.task_result("worker:0").exit_code, 5)
        self.assertEqual(
            re.findall(r"restart (\d/\d)", err.getvalue()), ["1/2", "2/2"]
        )

    def test_negative_restarts_raises_launcher_error(self):
        with self.assertRaisesRegex(errors.LauncherError, r"restarts=-1"):
            restart.run_local_job(
                programs.python("pass"), job.JobShape(1), env={}, restarts=-1
            )


if __name__ == "__main__":
    absltest.main()
