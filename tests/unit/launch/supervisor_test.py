"""Tests for tfdist.launch.supervisor: LocalJob's output and supervision."""

from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import threading

from absl.testing import absltest
from absl.testing import parameterized

from tests.unit.launch import programs
from tfdist import errors
from tfdist.cluster import spec
from tfdist.cluster import tf_config
from tfdist.launch import job
from tfdist.launch import supervisor

# Short grace period so that tests of SIGKILL escalation stay fast.
_SHORT_GRACE_S = 0.5


class LocalJobOutputTest(parameterized.TestCase):
    def test_each_task_gets_its_own_tf_config_with_prefix(self):
        cluster = programs.local_cluster(
            2, num_ps=1, has_chief=True, has_evaluator=True
        )

        result, out, _ = programs.run_job(
            cluster,
            programs.python(
                programs.PRINT_TF_CONFIG_ALL,
                programs.fifos_for_every_task(self, cluster),
            ),
        )

        self.assertTrue(result.succeeded)
        configs = programs.prefixed_tf_configs(out)
        self.assertLen(configs, 5)
        for task in cluster.tasks():
            self.assertEqual(
                configs[task.name],
                spec.ClusterConfig(cluster=cluster, task=task),
            )

    def test_stderr_lines_go_to_stderr_with_prefix(self):
        code = "import sys; sys.stderr.write('oops\\npartial')"

        _, out, err = programs.run_job(
            programs.local_cluster(1), programs.python(code)
        )

        self.assertEqual(out, "")
        self.assertEqual(err, "[worker:0] oops\n[worker:0] partial\n")

    def test_lines_stay_whole_when_tasks_write_partial_lines_concurrently(
        self,
    ):
        # Each line leaves the task in two writes; readers see it whole.
        code = (
            "import json, os\n"
            "i = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
            "for n in range(2000):\n"
            "    os.write(1, f'task{i}-line{n}-'.encode())\n"
            "    os.write(1, ('x' * 50 + '\\n').encode())\n"
        )

        result, out, _ = programs.run_job(
            programs.local_cluster(3), programs.python(code)
        )

        self.assertTrue(result.succeeded)
        lines = out.splitlines()
        self.assertLen(lines, 6000)
        pattern = re.compile(r"^\[worker:(\d)\] task(\d)-line\d+-x{50}$")
        for line in lines:
            match = pattern.match(line)
            self.assertIsNotNone(match, line)
            self.assertEqual(match.group(1), match.group(2), line)

    def test_task_env_is_env_plus_tf_config(self):
        code = "import json, os; print(json.dumps(sorted(os.environ)))"
        out = io.StringIO()
        local_job = supervisor.LocalJob(
            programs.local_cluster(1),
            programs.python(code),
            env={"PATH": os.defpath, "ONLY_THIS": "1"},
            stdout=out,
        )

        local_job.run(timeout_s=programs.JOB_BOUND_S)

        names = set(json.loads(out.getvalue().split(" ", 1)[1]))
        self.assertContainsSubset(
            {"PATH", "ONLY_THIS", tf_config.TF_CONFIG_ENV_VAR}, names
        )
        self.assertNotIn("HOME", names)

    def test_command_function_gives_each_task_its_command(self):
        out = io.StringIO()
        local_job = supervisor.LocalJob(
            programs.local_cluster(2),
            lambda task: programs.python(
                "import sys; print(sys.argv[1])", task.name
            ),
            env=dict(os.environ),
            stdout=out,
        )

        local_job.run(timeout_s=programs.JOB_BOUND_S)

        self.assertCountEqual(
            out.getvalue().splitlines(),
            ["[worker:0] worker:0", "[worker:1] worker:1"],
        )


class LocalJobSupervisionTest(parameterized.TestCase):
    def test_failing_task_is_named_and_the_others_are_stopped(self):
        code = programs.by_task(
            {"worker:1": "raise SystemExit(3)", "*": programs.BLOCK_FOREVER}
        )

        result, _, _ = programs.run_job(
            programs.local_cluster(2, has_evaluator=True), programs.python(code)
        )

        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual(result.failed_task, spec.TaskSpec("worker", 1))
        self.assertEqual(result.task_result("worker:1").exit_code, 3)
        for name in ("worker:0", "evaluator:0"):
            self.assertTrue(result.task_result(name).was_stopped, name)
            self.assertEqual(
                result.task_result(name).exit_code, -signal.SIGTERM, name
            )
        self.assertEqual(result.exit_status, 1)
        self.assertStartsWith(
            result.describe(),
            "task worker:1 exited with code 3; stopped the other 2 task(s)",
        )
        self.assertLess(result.elapsed_s, programs.JOB_BOUND_S)

    def test_task_ignoring_sigterm_is_killed_after_grace_period(self):
        fifos = programs.make_fifos(self, "stubborn")
        fifo = os.path.join(fifos, "stubborn")
        # worker:0 ignores SIGTERM, then lets worker:1 fail.
        code = programs.by_task(
            {
                "worker:0": "import signal, threading, sys\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "open(sys.argv[1], 'w').close()\n"
                "threading.Event().wait()",
                "worker:1": "import sys\nopen(sys.argv[1]).read()\nsys.exit(4)",
            }
        )

        result, _, _ = programs.run_job(
            programs.local_cluster(2),
            programs.python(code, fifo),
            grace_period_s=_SHORT_GRACE_S,
        )

        stubborn = result.task_result("worker:0")
        self.assertTrue(stubborn.was_killed)
        self.assertEqual(stubborn.exit_code, -signal.SIGKILL)
        self.assertIn("worker:0 ignored it and was killed", result.describe())

    def test_multi_worker_rules_stop_ps_and_evaluator_once_workers_succeed(
        self,
    ):
        # As run_local_cluster runs a job with ps tasks: fn runs to its end
        # on the chief and every worker.
        code = programs.by_task(
            {
                "ps": programs.BLOCK_FOREVER,
                "evaluator": programs.BLOCK_FOREVER,
            }
        )
        cluster = programs.local_cluster(
            2, num_ps=1, has_chief=True, has_evaluator=True
        )

        result, _, _ = programs.run_job(
            cluster, programs.python(code), kind=job.JobKind.MULTI_WORKER
        )

        self.assertEqual(result.outcome, job.JobOutcome.SUCCEEDED)
        self.assertEqual(result.exit_status, 0)
        self.assertEqual(
            [r.task.name for r in result.stopped_tasks],
            ["ps:0", "evaluator:0"],
        )
        for name in ("chief:0", "worker:0", "worker:1"):
            self.assertEqual(result.task_result(name).exit_code, 0)

    def test_timeout_stops_every_task_and_names_the_timeout(self):
        result, _, _ = programs.run_job(
            programs.local_cluster(2),
            programs.python(programs.BLOCK_FOREVER),
            timeout_s=0.5,
        )

        self.assertEqual(result.outcome, job.JobOutcome.TIMED_OUT)
        self.assertEqual(result.exit_status, 124)
        self.assertLen(result.stopped_tasks, 2)
        self.assertIn("timeout_s=0.5", result.describe())
        self.assertLess(result.elapsed_s, programs.JOB_BOUND_S)

    @parameterized.named_parameters(
        ("sigint", signal.SIGINT, 130, None),
        ("sigterm", signal.SIGTERM, 143, None),
        ("sigint_host_network", signal.SIGINT, 130, False),
        ("sigterm_host_network", signal.SIGTERM, 143, False),
    )
    def test_request_stop_forwards_signal_to_every_task(
        self, signal_number, exit_status, isolate
    ):
        out = programs.ReadySink("ready", count=2)
        local_job = supervisor.LocalJob(
            programs.local_cluster(2),
            programs.python(programs.READY_THEN_BLOCK),
            env=dict(os.environ),
            stdout=out,
            # Escalation to SIGKILL is tested elsewhere; on a loaded machine
            # a task may need more than the default 5 s to exit.
            grace_period_s=programs.JOB_BOUND_S,
            isolate=isolate,
        )

        def stop_when_ready() -> None:
            if out.ready.wait(programs.JOB_BOUND_S):
                local_job.request_stop(signal_number)

        stopper = threading.Thread(target=stop_when_ready)
        stopper.start()
        result = local_job.run(timeout_s=programs.JOB_BOUND_S)
        stopper.join()

        self.assertEqual(result.outcome, job.JobOutcome.INTERRUPTED)
        self.assertEqual(result.exit_status, exit_status)
        for task_result in result.tasks:
            self.assertEqual(task_result.exit_code, -signal_number)
        self.assertIn(
            f"received {signal.Signals(signal_number).name}",
            result.describe(),
        )

    def test_process_left_behind_by_a_task_is_killed(self):
        # The shell exits at once; its background child holds the pipe.
        command = ["/bin/sh", "-c", "sleep 600 & echo $!"]

        result, out, _ = programs.run_job(programs.local_cluster(1), command)

        self.assertTrue(result.succeeded)
        pid = int(out.split()[1])
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # Already gone.
        try:
            # Readable once the process has exited; SIGKILL is asynchronous.
            readable, _, _ = select.select(
                [pidfd], [], [], programs.JOB_BOUND_S
            )
        finally:
            os.close(pidfd)
        self.assertEqual(readable, [pidfd])

    def test_missing_program_raises_launcher_error(self):
        local_job = supervisor.LocalJob(
            programs.local_cluster(2),
            ["/nonexistent/tfdist-test-program"],
            env=dict(os.environ),
        )

        with self.assertRaisesRegex(
            errors.LauncherError, r"cannot start task worker:0"
        ):
            local_job.run()

    def test_run_twice_raises_runtime_error(self):
        local_job = supervisor.LocalJob(
            programs.local_cluster(1),
            programs.python("pass"),
            env=dict(os.environ),
        )
        local_job.run(timeout_s=programs.JOB_BOUND_S)

        with self.assertRaisesRegex(RuntimeError, r"runs once"):
            local_job.run()

    @parameterized.named_parameters(
        ("empty_command", [], errors.LauncherError, r"command=\[\] is empty"),
        ("str_command", "python x.py", TypeError, r"sequence of str"),
    )
    def test_bad_command_raises(self, command, error, pattern):
        with self.assertRaisesRegex(error, pattern):
            supervisor.LocalJob(programs.local_cluster(1), command, env={})


if __name__ == "__main__":
    absltest.main()
