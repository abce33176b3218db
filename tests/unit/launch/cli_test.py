"""Tests for the `python -m tfdist.launch` / `tfdist-launch` command line.

Most tests call `run_cli` in this process with string buffers for output;
the launched tasks are tiny `python -c` programs without TensorFlow. The
signal test starts the launcher itself as a process.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import queue
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from unittest import mock

import yaml
from absl.testing import absltest
from absl.testing import parameterized

from tests.unit.launch import programs
from tfdist import launch
from tfdist.cluster import tf_config
from tfdist.launch import cli

# Flags for a job with a task of every type: 5 tasks.
_EVERY_TASK_TYPE = ("--workers", "2", "--ps", "1", "--chief", "--evaluator")
_EVERY_TASK_NAME = ("chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0")


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.run_cli(list(argv), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


class LaunchTest(parameterized.TestCase):
    def test_every_task_gets_its_own_tf_config_with_prefix(self):
        status, out, err = _cli(
            *_EVERY_TASK_TYPE,
            "--",
            *programs.python(
                programs.PRINT_TF_CONFIG_ALL,
                programs.make_fifos(self, *_EVERY_TASK_NAME),
            ),
        )

        self.assertEqual(status, 0, err)
        configs = programs.prefixed_tf_configs(out)
        self.assertCountEqual(configs, _EVERY_TASK_NAME)
        (cluster,) = {config.cluster for config in configs.values()}
        for name, config in configs.items():
            self.assertIsNotNone(config.task)
            self.assertEqual(config.task.name, name)
        for address in cluster.to_dict()["worker"]:
            self.assertStartsWith(address, "127.0.0.1:")
        self.assertIn("tfdist-launch: the chief exited 0", err)

    def test_failing_task_named_with_exit_code_and_others_stopped(self):
        code = (
            "import json, os, sys, threading\n"
            "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
            "    sys.exit(3)\n"
            "threading.Event().wait()\n"
        )
        started_s = time.monotonic()

        status, _, err = _cli("--workers", "3", "--", *programs.python(code))

        self.assertEqual(status, 1)
        self.assertIn(
            "tfdist-launch: task worker:1 exited with code 3; stopped the "
            "other 2 task(s): worker:0, worker:2.",
            err,
        )
        self.assertLess(time.monotonic() - started_s, programs.JOB_BOUND_S)

    def test_restarts_relaunch_after_first_failure(self):
        marker = os.path.join(self.create_tempdir().full_path, "failed-once")

        status, _, err = _cli(
            "--workers",
            "1",
            "--restarts",
            "1",
            "--",
            *programs.python(programs.FAIL_ONCE, marker),
        )

        self.assertEqual(status, 0, err)
        self.assertIn(
            "tfdist-launch: restart 1/1: task worker:0 exited with code 3",
            err,
        )

    def test_preload_imports_once_for_every_task_and_restart(self):
        tmp = self.create_tempdir().full_path
        imports = os.path.join(tmp, "imports")
        script = os.path.join(tmp, "task.py")
        with open(script, "w") as f:
            f.write(
                "import sys\n"
                "import tests.unit.launch.preloaded\n"
                + programs.FAIL_ONCE.replace("import sys\n", "", 1)
            )
        env = {
            "TFDIST_TEST_IMPORTS": imports,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [programs.REPO_ROOT, os.environ.get("PYTHONPATH")])
            ),
        }

        with mock.patch.dict(os.environ, env):
            status, _, err = _cli(
                "--workers", "2", "--restarts", "1",
                "--preload", "tests.unit.launch.preloaded",
                "--", sys.executable, script, os.path.join(tmp, "failed-once"),
            )

        self.assertEqual(status, 0, err)
        self.assertIn("tfdist-launch: restart 1/1", err)
        # Four task starts (two attempts of two workers), one import: the
        # template's.
        with open(imports) as f:
            self.assertLen(f.read().split(), 1)

    def test_timeout_kills_every_task_and_exits_124(self):
        started_s = time.monotonic()

        status, _, err = _cli(
            "--workers",
            "2",
            "--timeout-s",
            "0.5",
            "--grace-period-s",
            "1",
            "--",
            *programs.python(programs.BLOCK_FOREVER),
        )

        self.assertEqual(status, 124)
        self.assertIn("ran past timeout_s=0.5", err)
        self.assertIn("worker:0, worker:1", err)
        self.assertLess(time.monotonic() - started_s, programs.JOB_BOUND_S)

    def test_missing_program_is_a_usage_error(self):
        status, _, err = _cli("--workers", "1", "--", "/nonexistent/prog")

        self.assertEqual(status, 2)
        self.assertIn("cannot start task worker:0", err)


class ParameterServerLaunchTest(parameterized.TestCase):
    """`--chief --workers 2 --ps 2`: the chief's exit ends the job."""

    def _cli(
        self, codes: dict[str, str] | None = None, *flags: str
    ) -> tuple[int, str]:
        names = ("chief:0", "worker:0", "worker:1", "ps:0", "ps:1")
        fifos = programs.make_fifos(self, *names)
        marker = os.path.join(self.create_tempdir().full_path, "died")
        code = programs.parameter_server_job(codes)
        status, _, err = _cli(
            "--chief", "--workers", "2", "--ps", "2", *flags,
            "--", *programs.python(code, fifos, marker),
        )  # fmt: skip
        return status, err

    def test_chief_exit_0_ends_the_job_with_status_0(self):
        status, err = self._cli()

        self.assertEqual(status, 0, err)
        self.assertIn("tfdist-launch: the chief exited 0 in", err)
        self.assertIn("stopped the 4 task(s) still serving", err)

    def test_dead_worker_is_restarted_alone(self):
        status, err = self._cli(
            {
                "worker:0": programs.die_once(programs.EXIT_1),
            }
        )

        self.assertEqual(status, 0, err)
        self.assertIn("task worker:0 exited with code 1; restarting it", err)
        self.assertNotIn("restart 1/", err)  # The job was not relaunched.

    def test_no_worker_restarts_fails_the_job_at_the_first_death(self):
        status, err = self._cli(
            {
                "worker:0": programs.die_once(programs.EXIT_1),
            },
            "--worker-restarts",
            "0",
        )

        self.assertEqual(status, 1)
        self.assertIn("tfdist-launch: task worker:0 exited with code 1;", err)

    def test_dead_ps_relaunches_the_whole_job_with_restarts(self):
        status, err = self._cli(
            {
                "ps:1": programs.die_once(programs.EXIT_1),
            },
            "--restarts",
            "1",
        )

        self.assertEqual(status, 0, err)
        self.assertIn(
            "tfdist-launch: restart 1/1: task ps:1 exited with code 1", err
        )
        self.assertNotIn("restarting it alone", err)


class PrintTfConfigTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("without_command", ()),
        ("with_command", ("python", "train.py", "--name", "a b")),
    )
    def test_every_printed_tf_config_parses(self, command):
        hosts = "c:2222,w0:2222,w1:2222,p:2222,e:2222"
        argv = [
            *_EVERY_TASK_TYPE,
            "--print-tf-config",
            "--hosts",
            hosts,
        ]
        if command:
            argv += ["--", *command]

        status, out, err = _cli(*argv)

        self.assertEqual(status, 0, err)
        exports = [
            shlex.split(line)[1].split("=", 1)[1]
            for line in out.splitlines()
            if line.startswith("export TF_CONFIG=")
        ]
        configs = [tf_config.parse_tf_config(text) for text in exports]
        self.assertEqual(
            [c.task.name for c in configs],
            ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"],
        )
        self.assertEqual([c.address for c in configs], hosts.split(","))
        self.assertEqual(
            out.count(shlex.join(command) + "\n") if command else 0,
            5 if command else 0,
        )


class EmitTfjobTest(parameterized.TestCase):
    def test_manifest_is_yaml_with_replicas_name_and_image(self):
        status, out, err = _cli(
            "--workers",
            "4",
            "--ps",
            "2",
            "--chief",
            "--emit",
            "tfjob",
            "--name",
            "train-job",
            "--image",
            "me/train:1",
            "--restarts",
            "2",
            "--",
            "python",
            "train.py",
            "--steps",
            "10",
        )

        self.assertEqual(status, 0, err)
        manifest, policy = yaml.safe_load_all(out)
        self.assertEqual(policy["kind"], "NetworkPolicy")
        self.assertEqual(manifest["kind"], "TFJob")
        self.assertEqual(manifest["metadata"]["name"], "train-job")
        self.assertEqual(manifest["spec"]["runPolicy"]["backoffLimit"], 2)
        replicas = manifest["spec"]["tfReplicaSpecs"]
        self.assertEqual(
            {name: r["replicas"] for name, r in replicas.items()},
            {"Chief": 1, "Worker": 4, "PS": 2},
        )
        (container,) = replicas["Worker"]["template"]["spec"]["containers"]
        self.assertEqual(container["image"], "me/train:1")
        self.assertEqual(
            container["command"], ["python", "train.py", "--steps", "10"]
        )

    def test_no_network_policy_leaves_the_policy_out(self):
        status, out, err = _cli(
            "--workers", "2", "--emit", "tfjob", "--no-network-policy",
            "--", "python", "train.py",
        )  # fmt: skip

        self.assertEqual(status, 0, err)
        self.assertEqual(
            [d["kind"] for d in yaml.safe_load_all(out)], ["TFJob"]
        )


class BadArgumentsTest(parameterized.TestCase):
    @parameterized.named_parameters(
        (
            "zero_workers",
            ["--workers", "0", "--", "x"],
            r"--workers: expected an integer >= 1, received --workers '0'",
        ),
        (
            "text_workers",
            ["--workers", "two", "--", "x"],
            r"received --workers 'two'",
        ),
        (
            "inverted_worker_range",
            ["--workers", "3:2", "--", "x"],
            r"expected 1 <= MIN <= MAX workers; received --workers 3:2",
        ),
        (
            "worker_range_with_print_tf_config",
            ["--workers", "2:3", "--print-tf-config", "--hosts", "a:1,b:1,c:1"],
            r"--print-tf-config prints a fixed cluster; received --workers 2:3",
        ),
        (
            "slots_file_with_emit",
            ["--workers", "2:3", "--slots-file", "s", "--emit", "tfjob", "--", "x"],
            r"--slots-file 's' only applies to jobs this launcher runs",
        ),
        (
            "negative_ps",
            ["--workers", "1", "--ps", "-1", "--", "x"],
            r"expected an integer >= 0, received --ps '-1'",
        ),
        (
            "missing_workers",
            ["--", "x"],
            r"required: --workers. Pass the number of worker tasks",
        ),
        (
            "missing_command",
            ["--workers", "2"],
            r"no command to run; expected it after `--`",
        ),
        (
            "command_without_separator",
            ["--workers", "2", "python", "x.py"],
            r"unrecognized arguments: python x.py. Put the command to run "
            r"after `--`",
        ),
        (
            "zero_timeout",
            ["--workers", "1", "--timeout-s", "0", "--", "x"],
            r"seconds > 0, received --timeout-s '0'",
        ),
        (
            "hosts_count_mismatch",
            [
                "--workers",
                "2",
                "--ps",
                "1",
                "--chief",
                "--print-tf-config",
                "--hosts",
                "a:1,b:1",
            ],
            r"hosts lists 2 address\(es\) but the job has 4 task\(s\)",
        ),
        (
            "bad_host_port",
            ["--workers", "2", "--print-tf-config", "--hosts", "a:1,b:port"],
            r"hosts\[1\]='b:port' \(for task worker:1\) is not a valid",
        ),
        (
            "two_modes",
            [
                "--workers",
                "1",
                "--print-tf-config",
                "--hosts",
                "a:1",
                "--emit",
                "tfjob",
                "--",
                "x",
            ],
            r"--print-tf-config and --emit tfjob are two different modes",
        ),
        (
            "hosts_without_print",
            ["--workers", "1", "--hosts", "a:1", "--", "x"],
            r"--hosts 'a:1' only applies to --print-tf-config",
        ),
        (
            "print_without_hosts",
            ["--workers", "1", "--print-tf-config"],
            r"--print-tf-config needs --hosts",
        ),
        (
            "image_without_emit",
            ["--workers", "1", "--image", "i", "--", "x"],
            r"--image 'i' only applies to --emit tfjob",
        ),
        (
            "restarts_with_print",
            [
                "--workers",
                "1",
                "--print-tf-config",
                "--hosts",
                "a:1",
                "--restarts",
                "1",
            ],
            r"--restarts 1 does not apply to --print-tf-config",
        ),
        (
            "ps_without_chief",
            ["--workers", "2", "--ps", "1", "--", "x"],
            r"--ps 1 makes this a parameter-server job, .* Add --chief",
        ),
        (
            "worker_restarts_without_ps",
            ["--workers", "2", "--worker-restarts", "2", "--", "x"],
            r"--worker-restarts 2 only applies to parameter-server jobs",
        ),
        (
            "worker_restarts_with_emit",
            [
                "--workers",
                "1",
                "--ps",
                "1",
                "--chief",
                "--worker-restarts",
                "1",
                "--emit",
                "tfjob",
                "--",
                "x",
            ],
            r"--worker-restarts 1 does not apply to --print-tf-config or "
            r"--emit tfjob",
        ),
        (
            "negative_worker_restarts",
            ["--workers", "1", "--worker-restarts", "-1", "--", "x"],
            r"expected an integer >= 0, received --worker-restarts '-1'",
        ),
        (
            "no_isolate_with_emit",
            ["--workers", "1", "--no-isolate", "--emit", "tfjob", "--", "x"],
            r"--no-isolate does not apply to --emit tfjob",
        ),
        (
            "no_isolate_with_print",
            [
                "--workers",
                "1",
                "--no-isolate",
                "--print-tf-config",
                "--hosts",
                "a:1",
            ],
            r"--no-isolate does not apply to --print-tf-config",
        ),
        (
            "preload_with_emit",
            ["--workers", "1", "--preload", "tensorflow", "--emit", "tfjob", "--", "x"],
            r"--preload tensorflow does not apply to --emit tfjob",
        ),
        (
            "preload_not_a_module",
            ["--workers", "1", "--preload", "tensorflow,,numpy", "--", "x"],
            r"expected comma-separated module names, received --preload "
            r"'tensorflow,,numpy'",
        ),
        (
            "network_policy_without_emit",
            ["--workers", "1", "--no-network-policy", "--", "x"],
            r"--no-network-policy only applies to --emit tfjob",
        ),
        (
            "unknown_emit",
            ["--workers", "1", "--emit", "pod", "--", "x"],
            r"invalid choice: 'pod'",
        ),
        (
            "bad_tfjob_name",
            [
                "--workers",
                "1",
                "--emit",
                "tfjob",
                "--name",
                "Bad_Name",
                "--",
                "x",
            ],
            r"name='Bad_Name' is not a valid TFJob name",
        ),
    )
    def test_bad_arguments_exit_2_with_message(self, argv, pattern):
        status, out, err = _cli(*argv)

        self.assertEqual(status, 2)
        self.assertEqual(out, "")
        self.assertStartsWith(err, "usage: tfdist-launch")
        self.assertRegex(err, r"tfdist-launch: error: " + r".*" + pattern)

    def test_help_prints_usage_and_exits_0(self):
        status, out, _ = _cli("--help")

        self.assertEqual(status, 0)
        self.assertIn("usage: tfdist-launch --workers N", out)
        self.assertIn("--print-tf-config", out)
        self.assertIn("--no-isolate", out)
        self.assertIn("--worker-restarts K", out)
        self.assertIn(
            "parameter-server jobs (--ps M, which needs --chief)", out
        )
        self.assertIn("one private network namespace", out)


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


class LauncherProcessTest(parameterized.TestCase):
    def test_sigint_is_forwarded_and_every_task_exits(self):
        launcher_process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfdist.launch",
                "--workers",
                "2",
                "--grace-period-s",
                "5",
                "--",
                *programs.python(programs.READY_THEN_BLOCK),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(launcher_process.kill)
        lines: queue.Queue = queue.Queue()
        threading.Thread(
            target=_read_lines,
            args=(launcher_process.stdout, lines),
            daemon=True,
        ).start()
        pids = []
        while len(pids) < 2:
            line = lines.get(timeout=programs.JOB_BOUND_S)
            self.assertIsNotNone(line, "launcher exited before tasks ran")
            match = re.match(r"\[worker:\d\] ready (\d+)", line)
            if match:
                pids.append(int(match.group(1)))
        pidfds = [os.pidfd_open(pid) for pid in pids]
        self.addCleanup(lambda: [os.close(fd) for fd in pidfds])

        launcher_process.send_signal(signal.SIGINT)
        status = launcher_process.wait(timeout=programs.JOB_BOUND_S)

        self.assertEqual(status, 130)
        self.assertIn(
            "received SIGINT; forwarded it to 2 running task(s)",
            launcher_process.stderr.read(),
        )
        # Each pidfd is readable once its task has exited.
        readable, _, _ = select.select(pidfds, [], [], 0)
        self.assertCountEqual(readable, pidfds)

    def test_console_script_entry_point_is_run_cli(self):
        scripts = importlib.metadata.entry_points(
            group="console_scripts", name="tfdist-launch"
        )
        if not scripts:
            self.skipTest("tfdist is not installed (pip install -e .)")

        (script,) = scripts
        self.assertEqual(script.value, "tfdist.launch:run_cli")
        self.assertIs(script.load(), launch.run_cli)
        self.assertIs(launch.run_cli, cli.run_cli)


if __name__ == "__main__":
    absltest.main()
