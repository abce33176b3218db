"""Tests for LocalJob's parameter-server rules (JobKind.PARAMETER_SERVER).

The task programs stand in for a parameter-server strategy's processes:
worker and ps tasks announce that they serve and then block, as TF's
servers do; the chief waits until every other task serves and exits with
the code under test. No TensorFlow, no sleeps: FIFOs order everything.
"""

from __future__ import annotations

import os
import re
import signal

from absl.testing import absltest
from absl.testing import parameterized

from tests.unit.launch import programs
from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import job
from tfdist.launch import supervisor


class ParameterServerJobTest(parameterized.TestCase):
    def _run(
        self,
        codes: dict[str, str] | None = None,
        *,
        chief_exit_code: int = 0,
        **kwargs,
    ) -> tuple[job.JobResult, str, str]:
        """Runs chief + 2 workers + 2 ps (`programs.parameter_server_job`)."""
        cluster = programs.local_cluster(2, num_ps=2, has_chief=True)
        fifos = programs.fifos_for_every_task(self, cluster)
        marker = os.path.join(self.create_tempdir().full_path, "died")
        code = programs.parameter_server_job(
            codes, chief_exit_code=chief_exit_code
        )
        return programs.run_job(
            cluster, programs.python(code, fifos, marker), **kwargs
        )

    def test_chief_exit_0_succeeds_and_stops_the_serving_tasks(self):
        result, _, _ = self._run()

        self.assertEqual(result.kind, job.JobKind.PARAMETER_SERVER)
        self.assertEqual(result.outcome, job.JobOutcome.SUCCEEDED)
        self.assertEqual(result.exit_status, 0)
        self.assertEqual(result.task_result("chief:0").exit_code, 0)
        serving = ["worker:0", "worker:1", "ps:0", "ps:1"]
        self.assertEqual([r.task.name for r in result.stopped_tasks], serving)
        for name in serving:
            self.assertEqual(
                result.task_result(name).exit_code, -signal.SIGTERM, name
            )
        self.assertStartsWith(result.describe(), "the chief exited 0 in ")
        self.assertIn(
            "stopped the 4 task(s) still serving: worker:0, worker:1, ps:0, "
            "ps:1.",
            result.describe(),
        )

    def test_chief_exit_non_zero_fails_the_job(self):
        result, _, _ = self._run(chief_exit_code=3)

        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual(result.failed_task, spec.TaskSpec("chief", 0))
        self.assertEqual(result.exit_status, 1)
        self.assertLen(result.stopped_tasks, 4)
        self.assertStartsWith(
            result.describe(), "task chief:0 exited with code 3; stopped"
        )

    @parameterized.named_parameters(
        ("exit_1", programs.EXIT_1, "exited with code 1"),
        ("killed", programs.KILL_ITSELF, "was killed by SIGKILL"),
    )
    def test_worker_that_dies_is_restarted_alone_as_it_was(self, die, how):
        result, out, err = self._run(
            {
                "chief": "import os; print('chief', os.getpid(), flush=True)\n"
                + programs.chief_exiting(0),
                "worker:1": programs.die_once(die),
            }
        )

        # The chief waited for worker:1's second life, and then succeeded.
        self.assertTrue(result.succeeded, result.describe())
        self.assertEqual(
            {r.task.name: r.restarts for r in result.tasks},
            {"chief:0": 0, "worker:0": 0, "worker:1": 1, "ps:0": 0, "ps:1": 0},
        )
        self.assertEqual(
            err.count("restarting it alone"), 1, err
        )  # Nothing else was restarted.
        self.assertIn(
            f"tfdist-launch: task worker:1 {how}; restarting it alone (1/"
            f"{supervisor.DEFAULT_WORKER_RESTARTS}) with the same TF_CONFIG "
            "and port; the chief carries on.",
            err,
        )
        self.assertLen(re.findall(r"\[chief:0\] chief \d+", out), 1)
        # The first life died before serving; the second serves.
        self.assertLen(re.findall(r"\[worker:1\] life (.*)", out), 1)
        self.assertIn("restarted worker:1 1 time(s)", result.describe())

    def test_restarted_worker_keeps_tf_config_port_and_network(self):
        # Both lives of worker:1 print; the first then dies.
        die_after_printing = programs.PRINT_LIFE + programs.die_once(
            programs.EXIT_1
        )

        result, out, _ = self._run(
            {
                "worker:1": die_after_printing,
            }
        )

        self.assertTrue(result.succeeded, result.describe())
        first, second, third = re.findall(r"\[worker:1\] life (.*)", out)
        self.assertEqual(first, second)  # TF_CONFIG (so port) and namespace.
        self.assertEqual(second, third)  # The second life's SERVE line.

    def test_worker_dying_past_its_restarts_fails_the_job(self):
        result, _, err = self._run(
            {
                "worker:1": "import sys; sys.exit(1)",
            },
            worker_restarts=2,
        )

        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual(result.failed_task, spec.TaskSpec("worker", 1))
        self.assertEqual(result.task_result("worker:1").restarts, 2)
        self.assertEqual(
            re.findall(r"restarting it alone \((\d/\d)\)", err), ["1/2", "2/2"]
        )
        self.assertStartsWith(
            result.describe(),
            "task worker:1 exited with code 1 after 2 restart(s); stopped the "
            "other 4 task(s): chief:0, worker:0, ps:0, ps:1.",
        )

    def test_zero_worker_restarts_fails_at_the_first_death(self):
        result, _, err = self._run(
            {
                "worker:0": "import sys; sys.exit(1)",
            },
            worker_restarts=0,
        )

        self.assertEqual(result.failed_task, spec.TaskSpec("worker", 0))
        self.assertNotIn("restarting", err)

    @parameterized.named_parameters(
        ("ps", "ps:1"), ("evaluator", "evaluator:0")
    )
    def test_other_task_dying_fails_the_job_without_restart(self, name):
        cluster = programs.local_cluster(
            1, num_ps=2, has_chief=True, has_evaluator=True
        )
        fifos = programs.fifos_for_every_task(self, cluster)
        code = programs.parameter_server_job({name: "import sys; sys.exit(2)"})

        result, _, err = programs.run_job(
            cluster, programs.python(code, fifos, "-")
        )

        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual(result.failed_task.name, name)
        self.assertEqual(result.task_result(name).restarts, 0)
        self.assertNotIn("restarting", err)

    def test_ps_job_without_chief_raises_launcher_error(self):
        cluster = programs.local_cluster(2, num_ps=1)

        with self.assertRaisesRegex(
            errors.LauncherError, r"a parameter-server job needs a chief"
        ):
            supervisor.LocalJob(cluster, ["true"], env={})

    def test_multi_worker_rules_can_be_asked_for_with_ps_tasks(self):
        cluster = programs.local_cluster(1, num_ps=1)
        code = programs.by_task({"ps": programs.BLOCK_FOREVER})

        result, _, _ = programs.run_job(
            cluster, programs.python(code), kind=job.JobKind.MULTI_WORKER
        )

        self.assertTrue(result.succeeded)
        self.assertEqual(result.kind, job.JobKind.MULTI_WORKER)
        self.assertEqual([r.task.name for r in result.stopped_tasks], ["ps:0"])

    def test_negative_worker_restarts_raises_launcher_error(self):
        with self.assertRaisesRegex(
            errors.LauncherError, r"worker_restarts=-1"
        ):
            supervisor.LocalJob(
                programs.local_cluster(1, num_ps=1, has_chief=True),
                ["true"],
                env={},
                worker_restarts=-1,
            )


if __name__ == "__main__":
    absltest.main()
