"""Tests for tfdist.launch.preload: tasks forked from a template process."""

from __future__ import annotations

import json
import os
import sys

from absl.testing import absltest

from tests.unit.launch import programs
from tfdist import errors
from tfdist.launch import job
from tfdist.launch import preload
from tfdist.launch import supervisor

MODULE = "tests.unit.launch.preloaded"

#: What a task reports about the interpreter it runs in, as one JSON line.
REPORT = """\
import json, os, sys
import tests.unit.launch.preloaded as preloaded
print(json.dumps({
    "name": __name__,
    "argv": sys.argv,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "task": json.loads(os.environ["TF_CONFIG"])["task"],
    "mark": preloaded.MARK,
    "stdin": sys.stdin.read(),
    "net": os.readlink("/proc/self/ns/net"),
    "session_leader": os.getsid(0) == os.getpid(),
    "buffers": [type(sys.stdout.buffer).__name__, type(sys.stderr.buffer).__name__],
}), flush=True)
"""


class PreloadTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = self.create_tempdir().full_path
        self.imports = os.path.join(self.dir, "imports")
        open(self.imports, "w").close()

    def env(self, mark: str = "a") -> dict[str, str]:
        # A template per test: its environment names this test's files.
        # Without PYTHONUNBUFFERED (which a test runner may set), so that
        # buffering is the interpreter's default or the command's `-u`.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        env.update(
            TFDIST_TEST_IMPORTS=self.imports,
            TFDIST_TEST_MARK=mark,
            PYTHONPATH=os.pathsep.join(filter(None, [programs.REPO_ROOT, env.get("PYTHONPATH")])),
        )
        return env

    def script(self, code: str) -> str:
        path = os.path.join(self.dir, "task.py")
        with open(path, "w") as f:
            f.write(code)
        return path

    def run_job(self, code: str, *, num_workers: int = 1, modules=(MODULE,), mark: str = "a",
                command=None, timeout_s: float | None = programs.JOB_BOUND_S, **kwargs):
        command = command or [sys.executable, self.script(code), "arg1", "--flag=2"]
        return programs.run_job(
            programs.local_cluster(num_workers), command, timeout_s=timeout_s,
            preload=modules, env=self.env(mark), **kwargs)

    def imported_in(self) -> list[str]:
        with open(self.imports) as f:
            return f.read().split()

    def reports(self, out: str) -> dict[str, dict]:
        return {line.split(" ", 1)[0].strip("[]"): json.loads(line.split(" ", 1)[1])
                for line in out.splitlines()}

    def test_a_forked_task_runs_as_a_fresh_interpreter_would(self):
        script = self.script(REPORT)
        results = {}
        for options in [(), ("-u",)]:
            for modules in [(), (MODULE,)]:
                result, out, err = self.run_job(
                    "", num_workers=2, modules=modules, isolate=False,
                    command=[sys.executable, *options, script, "arg1", "--flag=2"])
                self.assertTrue(result.succeeded, err)
                results[options, modules] = self.reports(out)

        for options in [(), ("-u",)]:
            self.assertEqual(results[options, (MODULE,)], results[options, ()])
        self.assertLen(self.imported_in(), 2 * 2 + 1)  # Fresh tasks' imports, then one template.
        fresh = results[(), ()]["worker:1"]
        self.assertEqual(fresh["argv"], [script, "arg1", "--flag=2"])
        self.assertEqual(fresh["name"], "__main__")
        self.assertEqual(fresh["path0"], self.dir)
        self.assertEqual(fresh["task"], {"type": "worker", "index": 1})
        self.assertTrue(fresh["session_leader"])
        self.assertEqual(fresh["buffers"], ["BufferedWriter", "BufferedWriter"])
        self.assertEqual(results[("-u",), ()]["worker:1"]["buffers"], ["FileIO", "FileIO"])

    def test_the_modules_are_imported_once_for_every_task(self):
        fresh, _, _ = self.run_job(REPORT, num_workers=3, modules=())
        self.assertTrue(fresh.succeeded)
        self.assertLen(self.imported_in(), 3)  # One import per task.

        for _ in range(2):  # Two jobs, one template.
            forked, _, err = self.run_job(REPORT, num_workers=3)
            self.assertTrue(forked.succeeded, err)

        self.assertLen(self.imported_in(), 4)  # ...and one for the template.

    def test_a_module_sees_the_environment_of_the_tasks_at_import(self):
        marks = {}
        for mark in ["a", "b"]:
            result, out, err = self.run_job(REPORT, mark=mark)
            self.assertTrue(result.succeeded, err)
            marks[mark] = self.reports(out)["worker:0"]["mark"]

        self.assertEqual(marks, {"a": "a", "b": "b"})
        self.assertLen(self.imported_in(), 2)  # A template per environment.

    def test_forked_tasks_run_in_the_jobs_private_network(self):
        programs.skip_without_network_namespaces(self)

        result, out, err = self.run_job(REPORT, num_workers=2, isolate=True)

        self.assertTrue(result.succeeded, err)
        nets = {report["net"] for report in self.reports(out).values()}
        self.assertLen(nets, 1)
        self.assertNotEqual(nets.pop(), os.readlink("/proc/self/ns/net"))

    def test_exit_status_and_uncaught_exception_as_an_interpreter_reports_them(self):
        cases = {
            "import sys; sys.exit(3)": 3,
            "raise SystemExit('bye')": 1,
            "raise ValueError('boom')": 1,
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)": -9,
            "print('done')": 0,
        }
        for code, expected in cases.items():
            with self.subTest(code=code):
                result, _, err = self.run_job(code)
                self.assertEqual(result.tasks[0].exit_code, expected, err)
                if "ValueError" in code:
                    self.assertIn("[worker:0] ValueError: boom", err)
                    self.assertIn("Traceback (most recent call last)", err)

    def test_output_written_without_flush_arrives_at_exit(self):
        result, out, err = self.run_job("import sys; print('out'); sys.stderr.write('err\\n')")

        self.assertTrue(result.succeeded, err)
        self.assertEqual(out, "[worker:0] out\n")
        self.assertEqual(err, "[worker:0] err\n")

    def test_the_timeout_stops_a_forked_task(self):
        result, _, _ = self.run_job(programs.BLOCK_FOREVER, timeout_s=1.0)

        self.assertEqual(result.outcome, job.JobOutcome.TIMED_OUT)
        self.assertTrue(result.tasks[0].was_stopped)

    def test_a_command_other_than_a_python_script_starts_afresh(self):
        result, _, err = self.run_job(
            "", command=programs.python(REPORT.replace('"name": __name__', '"name": "-c"')))

        self.assertTrue(result.succeeded, err)
        self.assertLen(self.imported_in(), 1)  # Imported by the task itself.
        self.assertFalse(preload.is_python_script(sys.executable, programs.python("pass")))
        self.assertFalse(preload.is_python_script("/bin/sh", ["sh", "x.py"]))
        self.assertFalse(preload.is_python_script(sys.executable, [sys.executable, "-O", "x.py"]))
        self.assertFalse(preload.is_python_script(sys.executable, [sys.executable, "-u"]))
        self.assertTrue(preload.is_python_script(sys.executable, [sys.executable, "x.py"]))
        self.assertTrue(preload.is_python_script(sys.executable, [sys.executable, "-u", "x.py"]))

    def test_a_module_that_fails_to_import_is_named_in_a_launcher_error(self):
        with self.assertRaisesRegex(
            errors.LauncherError,
            r"importing tfdist_no_such_module did not start: .*ModuleNotFoundError"):
            self.run_job("pass", modules=("tfdist_no_such_module",))

    def test_preload_must_be_module_names(self):
        for bad in ["tensorflow", ("",), (1,)]:
            with self.subTest(preload=bad), self.assertRaisesRegex(TypeError, "preload must be"):
                supervisor.LocalJob(programs.local_cluster(1), ["true"], env={}, preload=bad)


if __name__ == "__main__":
    absltest.main()
