"""Tests for tfdist.cluster.launcher: ports, hosts, TFJob, supervision.

Tasks are tiny `python -c` programs that import nothing from TensorFlow, so
each starts in a few tens of milliseconds. Tasks that must wait for each
other do so through a FIFO, never by sleeping.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import signal
import socket
import sys
import tempfile
import threading
from unittest import mock

import portpicker
import yaml
from absl.testing import absltest
from absl.testing import parameterized

from tfdist import errors
from tfdist.cluster import launcher
from tfdist.cluster import spec
from tfdist.cluster import tf_config

# Bounds on how long a job may take, far above what it needs: they catch a
# hang, not a slow machine.
_JOB_BOUND_S = 30.0
# Short grace period so that tests of SIGKILL escalation stay fast.
_SHORT_GRACE_S = 0.5

# Prints TF_CONFIG. The chief exits only after the ps and evaluator tasks
# have printed theirs (each closes its FIFO in argv[1] after printing), since
# the job stops those tasks as soon as the chief and workers are done.
_PRINT_TF_CONFIG_ALL = (
    "import json, os, sys\n"
    "print(os.environ['TF_CONFIG'], flush=True)\n"
    "kind = json.loads(os.environ['TF_CONFIG'])['task']['type']\n"
    "if kind in ('ps', 'evaluator'):\n"
    "    open(os.path.join(sys.argv[1], kind), 'w').close()\n"
    "elif kind == 'chief':\n"
    "    for other in ('ps', 'evaluator'):\n"
    "        open(os.path.join(sys.argv[1], other)).read()\n"
)


def _make_fifos(test: absltest.TestCase) -> str:
    """A directory holding the FIFOs `ps` and `evaluator`."""
    directory = test.create_tempdir().full_path
    for name in ("ps", "evaluator"):
        os.mkfifo(os.path.join(directory, name))
    return directory


_BLOCK_FOREVER = "import threading; threading.Event().wait()"
# Prints "ready" once SIGINT and SIGTERM would end it, then blocks. SIGINT
# gets the kernel's default action, not Python's KeyboardInterrupt handler:
# what is tested is that the launcher delivers the signal. (Twice in the
# full suite, never alone, a task was still alive 30 s after its SIGINT with
# Python's handler; the cause was not found.)
_READY_THEN_BLOCK = (
    "import signal, threading; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "print('ready', flush=True); threading.Event().wait()"
)


def _python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def _by_task_index(codes: dict[int, str]) -> str:
    """Code that runs `codes[task index]`, chosen from TF_CONFIG."""
    branches = "\n".join(
        f"if index == {i}:\n    exec({code!r})" for i, code in codes.items()
    )
    return (
        "import json, os\n"
        "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
        f"{branches}\n"
    )


class _ReadySink(io.StringIO):
    """A StringIO that sets `ready` once `count` lines contain `marker`."""

    def __init__(self, marker: str, count: int) -> None:
        super().__init__()
        self.ready = threading.Event()
        self._marker = marker
        self._remaining = count

    def write(self, text: str) -> int:
        if self._marker in text:
            self._remaining -= 1
            if self._remaining == 0:
                self.ready.set()
        return super().write(text)


def _run(
    cluster: spec.ClusterSpec,
    command: list[str],
    *,
    timeout_s: float | None = _JOB_BOUND_S,
    grace_period_s: float = launcher.DEFAULT_GRACE_PERIOD_S,
) -> tuple[launcher.JobResult, str, str]:
    out, err = io.StringIO(), io.StringIO()
    job = launcher.LocalJob(
        cluster,
        command,
        env=dict(os.environ),
        grace_period_s=grace_period_s,
        stdout=out,
        stderr=err,
    )
    result = job.run(timeout_s=timeout_s)
    return result, out.getvalue(), err.getvalue()


def _port(address: str) -> int:
    return spec.Address.parse(address).port


def _addresses(cluster: spec.ClusterSpec) -> list[str]:
    return [cluster.address(task) for task in cluster.tasks()]


class MakeLocalClusterTest(parameterized.TestCase):
    def test_tasks_in_job_order_on_loopback_with_every_job(self):
        cluster = launcher.make_local_cluster(
            2, num_ps=1, has_chief=True, has_evaluator=True
        )

        self.assertEqual(
            [t.name for t in cluster.tasks()],
            ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"],
        )
        hosts = {spec.Address.parse(a).host for a in _addresses(cluster)}
        self.assertEqual(hosts, {"127.0.0.1"})

    def test_ports_are_distinct_and_bindable_after_return(self):
        cluster = launcher.make_local_cluster(3, num_ps=2)

        ports = [_port(a) for a in _addresses(cluster)]
        self.assertLen(set(ports), 5)
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))  # Raises if still held.

    def test_never_hands_out_a_port_bound_by_another_socket(self):
        real_pick = portpicker.pick_unused_port
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            held_port = held.getsockname()[1]
            free_port = real_pick()
            # The held port twice, then a free one twice (a duplicate), then
            # whatever portpicker finds.
            candidates = iter([held_port, held_port, free_port, free_port])
            with mock.patch.object(
                portpicker,
                "pick_unused_port",
                side_effect=lambda: next(candidates, None) or real_pick(),
            ):
                cluster = launcher.make_local_cluster(2)

        ports = [_port(a) for a in _addresses(cluster)]
        self.assertNotIn(held_port, ports)
        self.assertEqual(ports[0], free_port)
        self.assertLen(set(ports), 2)

    def test_raises_launcher_error_when_every_candidate_is_bound(self):
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held_port = held.getsockname()[1]
            with mock.patch.object(
                portpicker, "pick_unused_port", return_value=held_port
            ):
                with self.assertRaisesRegex(
                    errors.LauncherError, r"found only 0 of the 1 free"
                ):
                    launcher.make_local_cluster(1)

    @parameterized.named_parameters(
        ("zero_workers", {"num_workers": 0}, r"num_workers=0"),
        ("negative_ps", {"num_workers": 1, "num_ps": -1}, r"num_ps=-1"),
    )
    def test_bad_count_raises_launcher_error(self, kwargs, pattern):
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            launcher.make_local_cluster(**kwargs)

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
            launcher.make_local_cluster(**kwargs)


class ClusterFromHostsTest(parameterized.TestCase):
    def test_hosts_assigned_in_order_chief_workers_ps_evaluator(self):
        cluster = launcher.cluster_from_hosts(
            ["c:1", "w0:1", "w1:1", "p:1", "e:1"],
            num_workers=2,
            num_ps=1,
            has_chief=True,
            has_evaluator=True,
        )

        self.assertEqual(
            cluster.to_dict(),
            {
                "chief": ["c:1"],
                "worker": ["w0:1", "w1:1"],
                "ps": ["p:1"],
                "evaluator": ["e:1"],
            },
        )

    @parameterized.named_parameters(
        (
            "too_few",
            ["a:1", "b:1"],
            r"hosts lists 2 address\(es\) but the job has 3 task\(s\)",
        ),
        ("bad_port", ["a:1", "b:x", "c:1"], r"hosts\[1\]='b:x'"),
        ("no_port", ["a:1", "b:1", "c"], r"hosts\[2\]='c'"),
        ("repeated", ["a:1", "b:1", "a:1"], r"hosts\[2\]='a:1' repeats"),
    )
    def test_bad_hosts_raise_launcher_error(self, hosts, pattern):
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            launcher.cluster_from_hosts(hosts, num_workers=2, num_ps=1)


class TfjobManifestTest(parameterized.TestCase):
    def test_manifest_has_replica_specs_with_counts(self):
        manifest = yaml.safe_load(
            launcher.tfjob_manifest(
                ["python", "train.py", "--flag", 'it\'s "quoted"'],
                num_workers=3,
                num_ps=2,
                has_chief=True,
                has_evaluator=True,
                name="my-job",
                image="registry/me/train:1",
            )
        )

        self.assertEqual(manifest["apiVersion"], "kubeflow.org/v1")
        self.assertEqual(manifest["kind"], "TFJob")
        self.assertEqual(manifest["metadata"]["name"], "my-job")
        replicas = manifest["spec"]["tfReplicaSpecs"]
        self.assertEqual(
            {name: r["replicas"] for name, r in replicas.items()},
            {"Chief": 1, "Worker": 3, "PS": 2, "Evaluator": 1},
        )
        for replica in replicas.values():
            self.assertEqual(replica["restartPolicy"], "OnFailure")
            (container,) = replica["template"]["spec"]["containers"]
            self.assertEqual(container["name"], "tensorflow")
            self.assertEqual(container["image"], "registry/me/train:1")
            self.assertEqual(
                container["command"],
                ["python", "train.py", "--flag", 'it\'s "quoted"'],
            )
        self.assertNotIn("runPolicy", manifest["spec"])

    def test_workers_only_manifest_has_defaults_and_run_policy(self):
        manifest = yaml.safe_load(
            launcher.tfjob_manifest(
                ["python", "train.py"],
                num_workers=2,
                restarts=3,
                timeout_s=90.5,
            )
        )

        self.assertEqual(
            manifest["metadata"]["name"], launcher.DEFAULT_TFJOB_NAME
        )
        self.assertEqual(list(manifest["spec"]["tfReplicaSpecs"]), ["Worker"])
        self.assertEqual(
            manifest["spec"]["runPolicy"],
            {"backoffLimit": 3, "activeDeadlineSeconds": 91},
        )

    @parameterized.named_parameters(
        ("upper_case_name", {"name": "MyJob"}, r"name='MyJob' is not a valid"),
        ("long_name", {"name": "a" * 64}, r"at most 63"),
        ("empty_image", {"image": ""}, r"image='' is not"),
        ("spaced_image", {"image": "a b"}, r"image='a b' is not"),
        ("empty_command", {"command": []}, r"command=\[\] is empty"),
    )
    def test_bad_argument_raises_launcher_error(self, overrides, pattern):
        kwargs = {"command": ["python", "x.py"], "num_workers": 1}
        kwargs.update(overrides)
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            launcher.tfjob_manifest(**kwargs)


class LocalJobOutputTest(parameterized.TestCase):
    def test_each_task_gets_its_own_tf_config_with_prefix(self):
        cluster = launcher.make_local_cluster(
            2, num_ps=1, has_chief=True, has_evaluator=True
        )

        result, out, _ = _run(
            cluster, _python(_PRINT_TF_CONFIG_ALL, _make_fifos(self))
        )

        self.assertTrue(result.succeeded)
        lines = dict(line.split(" ", 1) for line in out.splitlines())
        self.assertLen(lines, 5)
        for task in cluster.tasks():
            config = tf_config.parse_tf_config(lines[f"[{task.name}]"])
            self.assertEqual(
                config, spec.ClusterConfig(cluster=cluster, task=task)
            )

    def test_stderr_lines_go_to_stderr_with_prefix(self):
        code = "import sys; sys.stderr.write('oops\\npartial')"

        _, out, err = _run(launcher.make_local_cluster(1), _python(code))

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

        result, out, _ = _run(launcher.make_local_cluster(3), _python(code))

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
        job = launcher.LocalJob(
            launcher.make_local_cluster(1),
            _python(code),
            env={"PATH": os.defpath, "ONLY_THIS": "1"},
            stdout=out,
        )

        job.run(timeout_s=_JOB_BOUND_S)

        names = json.loads(out.getvalue().split(" ", 1)[1])
        self.assertContainsSubset({"PATH", "ONLY_THIS", "TF_CONFIG"}, names)
        self.assertNotIn("HOME", names)

    def test_command_function_gives_each_task_its_command(self):
        out = io.StringIO()
        job = launcher.LocalJob(
            launcher.make_local_cluster(2),
            lambda task: _python("import sys; print(sys.argv[1])", task.name),
            env=dict(os.environ),
            stdout=out,
        )

        job.run(timeout_s=_JOB_BOUND_S)

        self.assertCountEqual(
            out.getvalue().splitlines(),
            ["[worker:0] worker:0", "[worker:1] worker:1"],
        )


class LocalJobSupervisionTest(parameterized.TestCase):
    def test_failing_task_is_named_and_the_others_are_stopped(self):
        code = _by_task_index({0: _BLOCK_FOREVER, 1: "raise SystemExit(3)"})
        cluster = launcher.make_local_cluster(2, num_ps=1)

        result, _, _ = _run(cluster, _python(code))

        self.assertEqual(result.outcome, launcher.JobOutcome.FAILED)
        self.assertEqual(result.failed_task, spec.TaskSpec("worker", 1))
        self.assertEqual(result.task_result("worker:1").exit_code, 3)
        for name in ("worker:0", "ps:0"):
            self.assertTrue(result.task_result(name).was_stopped, name)
            self.assertEqual(
                result.task_result(name).exit_code, -signal.SIGTERM, name
            )
        self.assertEqual(result.exit_status, 1)
        self.assertStartsWith(
            result.describe(),
            "task worker:1 exited with code 3; stopped the other 2 task(s)",
        )
        self.assertLess(result.elapsed_s, _JOB_BOUND_S)

    def test_task_ignoring_sigterm_is_killed_after_grace_period(self):
        with tempfile.TemporaryDirectory() as tmp:
            fifo = os.path.join(tmp, "fifo")
            os.mkfifo(fifo)
            # worker:0 ignores SIGTERM, then lets worker:1 fail.
            code = _by_task_index(
                {
                    0: "import signal, threading, sys\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "open(sys.argv[1], 'w').close()\n"
                    "threading.Event().wait()",
                    1: "import sys\nopen(sys.argv[1]).read()\nsys.exit(4)",
                }
            )

            result, _, _ = _run(
                launcher.make_local_cluster(2),
                _python(code, fifo),
                grace_period_s=_SHORT_GRACE_S,
            )

        stubborn = result.task_result("worker:0")
        self.assertTrue(stubborn.was_killed)
        self.assertEqual(stubborn.exit_code, -signal.SIGKILL)
        self.assertIn("worker:0 ignored it and was killed", result.describe())

    def test_ps_and_evaluator_are_stopped_once_workers_succeed(self):
        code = (
            "import json, os, threading\n"
            "task = json.loads(os.environ['TF_CONFIG'])['task']['type']\n"
            "if task in ('ps', 'evaluator'):\n"
            "    threading.Event().wait()\n"
        )
        cluster = launcher.make_local_cluster(
            2, num_ps=1, has_chief=True, has_evaluator=True
        )

        result, _, _ = _run(cluster, _python(code))

        self.assertEqual(result.outcome, launcher.JobOutcome.SUCCEEDED)
        self.assertEqual(result.exit_status, 0)
        self.assertEqual(
            [r.task.name for r in result.stopped_tasks],
            ["ps:0", "evaluator:0"],
        )
        for name in ("chief:0", "worker:0", "worker:1"):
            self.assertEqual(result.task_result(name).exit_code, 0)

    def test_timeout_stops_every_task_and_names_the_timeout(self):
        result, _, _ = _run(
            launcher.make_local_cluster(2),
            _python(_BLOCK_FOREVER),
            timeout_s=0.5,
        )

        self.assertEqual(result.outcome, launcher.JobOutcome.TIMED_OUT)
        self.assertEqual(result.exit_status, 124)
        self.assertLen(result.stopped_tasks, 2)
        self.assertIn("timeout_s=0.5", result.describe())
        self.assertLess(result.elapsed_s, _JOB_BOUND_S)

    @parameterized.named_parameters(
        ("sigint", signal.SIGINT, 130),
        ("sigterm", signal.SIGTERM, 143),
    )
    def test_request_stop_forwards_signal_to_every_task(
        self, signal_number, exit_status
    ):
        out = _ReadySink("ready", count=2)
        job = launcher.LocalJob(
            launcher.make_local_cluster(2),
            _python(_READY_THEN_BLOCK),
            env=dict(os.environ),
            stdout=out,
            # Escalation to SIGKILL is tested elsewhere; on a loaded machine
            # a task may need more than the default 5 s to exit.
            grace_period_s=_JOB_BOUND_S,
        )

        def stop_when_ready() -> None:
            if out.ready.wait(_JOB_BOUND_S):
                job.request_stop(signal_number)

        stopper = threading.Thread(target=stop_when_ready)
        stopper.start()
        result = job.run(timeout_s=_JOB_BOUND_S)
        stopper.join()

        self.assertEqual(result.outcome, launcher.JobOutcome.INTERRUPTED)
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

        result, out, _ = _run(launcher.make_local_cluster(1), command)

        self.assertTrue(result.succeeded)
        pid = int(out.split()[1])
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # Already gone.
        try:
            # Readable once the process has exited; SIGKILL is asynchronous.
            readable, _, _ = select.select([pidfd], [], [], _JOB_BOUND_S)
        finally:
            os.close(pidfd)
        self.assertEqual(readable, [pidfd])

    def test_missing_program_raises_launcher_error(self):
        job = launcher.LocalJob(
            launcher.make_local_cluster(2),
            ["/nonexistent/tfdist-test-program"],
            env=dict(os.environ),
        )

        with self.assertRaisesRegex(
            errors.LauncherError, r"cannot start task worker:0"
        ):
            job.run()

    def test_run_twice_raises_runtime_error(self):
        job = launcher.LocalJob(
            launcher.make_local_cluster(1),
            _python("pass"),
            env=dict(os.environ),
        )
        job.run(timeout_s=_JOB_BOUND_S)

        with self.assertRaisesRegex(RuntimeError, r"runs once"):
            job.run()

    @parameterized.named_parameters(
        ("empty_command", [], errors.LauncherError, r"command=\[\] is empty"),
        ("str_command", "python x.py", TypeError, r"sequence of str"),
    )
    def test_bad_command_raises(self, command, error, pattern):
        with self.assertRaisesRegex(error, pattern):
            launcher.LocalJob(launcher.make_local_cluster(1), command, env={})


class RunLocalJobTest(parameterized.TestCase):
    def test_restart_relaunches_on_fresh_ports_after_failure(self):
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "failed-once")
            # worker:1 fails the first time only; worker:0 always succeeds.
            code = _by_task_index(
                {
                    0: "pass",
                    1: "import sys\n"
                    "try:\n"
                    "    open(sys.argv[1], 'x').close()\n"
                    "except FileExistsError:\n"
                    "    sys.exit(0)\n"
                    "sys.exit(3)",
                }
            )
            err = io.StringIO()

            result = launcher.run_local_job(
                _python(code, marker),
                num_workers=2,
                env=dict(os.environ),
                restarts=1,
                timeout_s=_JOB_BOUND_S,
                stdout=io.StringIO(),
                stderr=err,
            )

        self.assertTrue(result.succeeded)
        log = err.getvalue()
        self.assertIn("restart 1/1: task worker:1 exited with code 3", log)
        starts = re.findall(r"starting 2 task\(s\): (.*)", log)
        self.assertLen(starts, 2)
        self.assertNotEqual(starts[0], starts[1])

    def test_failure_after_every_restart_returns_failed(self):
        err = io.StringIO()

        result = launcher.run_local_job(
            _python("raise SystemExit(5)"),
            num_workers=1,
            env=dict(os.environ),
            restarts=2,
            stderr=err,
        )

        self.assertEqual(result.outcome, launcher.JobOutcome.FAILED)
        self.assertEqual(result.task_result("worker:0").exit_code, 5)
        self.assertEqual(
            re.findall(r"restart (\d/\d)", err.getvalue()), ["1/2", "2/2"]
        )

    def test_negative_restarts_raises_launcher_error(self):
        with self.assertRaisesRegex(errors.LauncherError, r"restarts=-1"):
            launcher.run_local_job(
                _python("pass"), num_workers=1, env={}, restarts=-1
            )


if __name__ == "__main__":
    absltest.main()
