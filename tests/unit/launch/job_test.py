"""Tests for tfdist.launch.job: JobShape and the results' descriptions."""

from __future__ import annotations

import signal

from absl.testing import absltest
from absl.testing import parameterized

from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import job


class JobShapeTest(parameterized.TestCase):
    def test_tasks_in_order_chief_workers_ps_evaluator(self):
        shape = job.JobShape(2, num_ps=1, has_chief=True, has_evaluator=True)

        self.assertEqual(
            [t.name for t in shape.tasks()],
            ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"],
        )
        self.assertEqual(shape.num_tasks, 5)

    def test_cluster_spec_gives_tasks_addresses_in_order(self):
        shape = job.JobShape(2, has_chief=True)

        cluster = shape.cluster_spec(["c:1", "w0:1", "w1:1"])

        self.assertEqual(
            cluster.to_dict(), {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}
        )

    @parameterized.named_parameters(
        ("zero_workers", {"num_workers": 0}, r"num_workers=0"),
        ("negative_ps", {"num_workers": 1, "num_ps": -1}, r"num_ps=-1"),
    )
    def test_bad_count_raises_launcher_error(self, kwargs, pattern):
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            job.JobShape(**kwargs)

    @parameterized.named_parameters(
        ("str_workers", {"num_workers": "2"}, r"num_workers must be an int"),
        (
            "int_chief",
            {"num_workers": 1, "has_chief": 1},
            r"has_chief must be a bool",
        ),
    )
    def test_bad_type_raises_type_error(self, kwargs, pattern):
        with self.assertRaisesRegex(TypeError, pattern):
            job.JobShape(**kwargs)

    @parameterized.named_parameters(
        ("workers_only", {}, job.JobKind.MULTI_WORKER),
        (
            "chief_and_evaluator",
            {"has_chief": True, "has_evaluator": True},
            job.JobKind.MULTI_WORKER,
        ),
        ("ps", {"num_ps": 1, "has_chief": True}, job.JobKind.PARAMETER_SERVER),
    )
    def test_kind_is_parameter_server_exactly_with_ps_tasks(self, kwargs, kind):
        shape = job.JobShape(2, **kwargs)

        self.assertEqual(shape.kind, kind)
        self.assertEqual(
            job.JobKind.of(
                shape.cluster_spec(
                    [f"h:{p}" for p in range(1, 9)][: shape.num_tasks]
                )
            ),
            kind,
        )

    def test_counts_beyond_workers_are_keyword_only(self):
        with self.assertRaises(TypeError):
            job.JobShape(2, 1)  # type: ignore[misc]


class CheckCommandTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("empty", [], errors.LauncherError, r"command=\[\] is empty"),
        ("str", "python x.py", TypeError, r"sequence of str"),
        ("not_str_arg", ["python", 1], TypeError, r"command\[1\]=1"),
    )
    def test_bad_command_raises(self, command, error, pattern):
        with self.assertRaisesRegex(error, pattern):
            job.check_command(command)


def _result(outcome, tasks, **kwargs) -> job.JobResult:
    return job.JobResult(outcome=outcome, tasks=tuple(tasks), **kwargs)


class JobResultTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("succeeded", job.JobOutcome.SUCCEEDED, {}, 0),
        ("failed", job.JobOutcome.FAILED, {}, 1),
        ("timed_out", job.JobOutcome.TIMED_OUT, {"timeout_s": 1.0}, 124),
        (
            "sigint",
            job.JobOutcome.INTERRUPTED,
            {"signal_number": signal.SIGINT},
            130,
        ),
    )
    def test_exit_status_as_a_shell_reports_it(
        self, outcome, kwargs, exit_status
    ):
        result = _result(outcome, [], **kwargs)

        self.assertEqual(result.exit_status, exit_status)

    def test_describe_names_failed_and_stopped_tasks(self):
        worker_0 = spec.TaskSpec("worker", 0)
        worker_1 = spec.TaskSpec("worker", 1)
        result = _result(
            job.JobOutcome.FAILED,
            [
                job.TaskResult(
                    worker_0, -signal.SIGKILL, was_stopped=True, was_killed=True
                ),
                job.TaskResult(worker_1, 3),
            ],
            failed_task=worker_1,
        )

        self.assertEqual(
            result.describe(),
            "task worker:1 exited with code 3; stopped the other 1 task(s): "
            "worker:0 (worker:0 ignored it and was killed).",
        )

    def test_task_result_of_unknown_task_raises_key_error(self):
        with self.assertRaisesRegex(KeyError, r"task='ps:0' is not a task"):
            _result(job.JobOutcome.SUCCEEDED, []).task_result("ps:0")


if __name__ == "__main__":
    absltest.main()
