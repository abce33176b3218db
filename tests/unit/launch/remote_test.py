"""Tasks on other hosts: the remote shell's command, the host end's signal relay, the command line.

The "hosts" are 127.0.0.1 behind `programs.FAKE_RSH`, a stand-in for ssh
that runs the command here with the same pipes and exit status.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from absl.testing import absltest
from absl.testing import parameterized

from tests.unit.launch import programs
from tfdist import errors
from tfdist.launch import cli
from tfdist.launch import remote

#: Prints its TF_CONFIG's task, working directory and two variables as JSON.
_REPORT = (
    "import json, os\n"
    "print(json.dumps([json.loads(os.environ['TF_CONFIG']), os.getcwd(), "
    "os.environ.get('TFDIST_TEST_FORWARDED'), os.environ.get('TFDIST_TEST_HIDDEN', 'unset')]))\n"
)

#: Says it is up, then waits for a signal (SIGUSR1 ends it by default).
_WAIT = "import sys, time\nprint('up', flush=True)\ntime.sleep(60)\n"


def _state(pid):
    """A process's state letter ("Z": a zombie, as good as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _host_end(command):
    """Starts `tfdist.launch.remote_task` running `command`, its stdin a pipe, as a remote shell would."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tfdist.launch.remote_task", "--cwd", os.getcwd(), "--", *command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    if process.stdout.readline() != b"up\n":
        process.kill()
        raise AssertionError("the task did not start")
    return process


class HostEndTest(absltest.TestCase):
    def test_a_signal_line_reaches_the_task_and_its_status_comes_back(self):
        process = _host_end(programs.python(_WAIT))
        process.stdin.write(remote.encode_signal(signal.SIGUSR1))
        process.stdin.flush()
        # Dies of it too (ssh reports 255: a lost task, never 143, a saved one).
        self.assertEqual(process.wait(timeout=programs.JOB_BOUND_S), -signal.SIGUSR1)

    def test_the_end_of_its_input_kills_the_task(self):
        # The launcher, or the connection, is gone: no task outlives it.
        process = _host_end(programs.python(_WAIT))
        process.stdin.close()
        self.assertEqual(process.wait(timeout=programs.JOB_BOUND_S), -signal.SIGKILL)

    def test_a_signal_to_the_host_end_itself_kills_the_task_first(self):
        process = _host_end(programs.python(_WAIT + "\n"))
        pid_line = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True)
        (task,) = [int(p) for p in pid_line.stdout.split()]
        process.send_signal(signal.SIGHUP)  # A tty's hang-up, or someone on the host.
        self.assertEqual(process.wait(timeout=programs.JOB_BOUND_S), -signal.SIGHUP)
        deadline = time.monotonic() + programs.JOB_BOUND_S
        while os.path.exists(f"/proc/{task}") and _state(task) != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(os.path.exists(f"/proc/{task}") and _state(task) != "Z")

    def test_an_exit_status_passes_through(self):
        process = _host_end(programs.python("print('up', flush=True)\nraise SystemExit(7)"))
        self.assertEqual(process.wait(timeout=programs.JOB_BOUND_S), 7)


class RemoteShellTest(absltest.TestCase):
    def test_passes_tf_config_tfdist_and_forwarded_variables_only(self):
        shell = remote.RemoteShell(("ssh", "-p", "2200"), python="/opt/py/bin/python", forward_env=("DATA",))
        env = {"TF_CONFIG": '{"a": 1}', "TFDIST_X": "1", "DATA": "/d x", "PATH": "/bin", "SECRET": "s"}
        argv = shell.command("h1", ["python", "-u", "train.py"], env, cwd="/job")
        self.assertEqual(argv[:4], ["ssh", "-p", "2200", "h1"])
        self.assertEqual(
            shlex.split(argv[4]),
            [
                "/opt/py/bin/python", "-m", "tfdist.launch.remote_task", "--cwd", "/job",
                "--env", "DATA=/d x", "--env", "PATH=/bin", "--env", "TFDIST_X=1",
                "--env", 'TF_CONFIG={"a": 1}', "--", "python", "-u", "train.py",
            ],
        )

    def test_bad_arguments_raise_launcher_error(self):
        with self.assertRaisesRegex(errors.LauncherError, r"rsh must be a non-empty sequence.*rsh=\(\)"):
            remote.RemoteShell(())
        with self.assertRaisesRegex(errors.LauncherError, r"--env takes variable names; received 'A-B'"):
            remote.RemoteShell(forward_env=("A-B",))


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    status = cli.run_cli(list(argv), stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


class HostsFileCommandLineTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.hosts_file = self.create_tempfile("hosts", "127.0.0.1 slots=3\n").full_path

    def test_each_task_runs_through_the_remote_shell_with_its_tf_config(self):
        os.environ["TFDIST_TEST_FORWARDED"] = "yes"
        self.addCleanup(os.environ.pop, "TFDIST_TEST_FORWARDED")
        status, out, err = _cli(
            "--workers", "2", "--chief", "--hosts-file", self.hosts_file,
            "--rsh", shlex.join(programs.FAKE_RSH), "--port", "23400",
            "--", *programs.python(_REPORT),
        )
        self.assertEqual(status, 0, err)
        reports = {}
        for line in out.splitlines():
            name, _, text = line.partition(" ")
            reports[name] = json.loads(text)
        self.assertCountEqual(reports, ["[chief:0]", "[worker:0]", "[worker:1]"])
        for name, (config, cwd, forwarded, hidden) in reports.items():
            self.assertEqual(f"[{config['task']['type']}:{config['task']['index']}]", name)
            self.assertEqual(
                config["cluster"],
                {"chief": ["127.0.0.1:23400"], "worker": ["127.0.0.1:23401", "127.0.0.1:23402"]},
            )
            self.assertEqual(cwd, os.getcwd())
            # tfdist's own variables pass, as they would to a local task.
            self.assertEqual((forwarded, hidden), ("yes", "unset"))
        self.assertIn("the tasks run on their hosts' networks", err)

    def test_env_forwards_named_variables_only(self):
        os.environ["TEST_FORWARD_ME"] = "1"
        os.environ["TEST_KEEP_ME_HERE"] = "1"
        self.addCleanup(os.environ.pop, "TEST_FORWARD_ME")
        self.addCleanup(os.environ.pop, "TEST_KEEP_ME_HERE")
        status, out, err = _cli(
            "--workers", "1", "--hosts-file", self.hosts_file, "--rsh", shlex.join(programs.FAKE_RSH),
            "--env", "TEST_FORWARD_ME", "--",
            *programs.python("import os; print(os.environ.get('TEST_FORWARD_ME'), os.environ.get('TEST_KEEP_ME_HERE'))"),
        )
        self.assertEqual(status, 0, err)
        self.assertEqual(out, "[worker:0] 1 None\n")

    @parameterized.named_parameters(
        ("rsh_alone", ["--rsh", "ssh"], r"--rsh ssh only applies to --hosts-file"),
        ("port_alone", ["--port", "2222"], r"--port 2222 only applies to --hosts-file"),
        ("with_slots_file", ["--hosts-file", "h", "--slots-file", "s"], r"--slots-file s does not go with --hosts-file 'h'"),
        ("with_preload", ["--hosts-file", "h", "--preload", "tensorflow"], r"--preload tensorflow does not go with"),
        ("bad_port", ["--hosts-file", "h", "--port", "70000"], r"expected a TCP port <= 65535, received --port '70000'"),
        ("bad_env", ["--hosts-file", "h", "--env", "A-B"], r"expected comma-separated variable names"),
    )
    def test_bad_arguments_exit_2_with_message(self, flags, pattern):
        status, out, err = _cli("--workers", "1", *flags, "--", "x")
        self.assertEqual((status, out), (2, ""))
        self.assertRegex(err, r"tfdist-launch: error: .*" + pattern)

    def test_a_malformed_hosts_file_exits_2_naming_the_line(self):
        path = self.create_tempfile("bad", "127.0.0.1 slots=2\nnode b\n").full_path
        status, _, err = _cli("--workers", "1", "--hosts-file", path, "--", "x")
        self.assertEqual(status, 2)
        self.assertIn(f"{path}, line 2: 'node b' is not a host entry", err)

    def test_too_few_slots_exit_2(self):
        path = self.create_tempfile("small", "127.0.0.1 slots=2\n").full_path
        started = time.monotonic()
        status, _, err = _cli("--workers", "2:4", "--chief", "--hosts-file", path, "--", "x")
        self.assertEqual(status, 2)
        self.assertIn(f"the hosts file {path!r} grants 1 worker(s), fewer than the 2 the job needs", err)
        self.assertLess(time.monotonic() - started, programs.JOB_BOUND_S)


if __name__ == "__main__":
    absltest.main()
