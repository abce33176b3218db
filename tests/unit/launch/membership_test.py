"""Elastic jobs: `--workers MIN:MAX`, a lost worker, a preempted task, a slots or hosts file.

The tasks are `python -c` programs (tests/unit/launch/programs.py); what a
real training script does on SIGTERM (save at a step, exit 143) is
`tfdist.elastic`'s, tested in tests/integration/elastic_test.py.
"""

from __future__ import annotations

import io
import os
import shlex
import threading
import time

from absl.testing import absltest
from absl.testing import parameterized

from tests.unit.launch import programs
from tfdist import errors
from tfdist.launch import job
from tfdist.launch import membership
from tfdist.launch import remote
from tfdist.launch import restart

#: Writes the attempt's worker count to argv[1]/workers-<n>, then runs the
#: attempt's part: ATTEMPT_BODY with `first` (no argv[1]/done yet) and `n`.
_PRELUDE = (
    "import json, os, signal, sys, time\n"
    "config = json.loads(os.environ['TF_CONFIG'])\n"
    "n = len(config['cluster']['worker'])\n"
    "name = f\"{config['task']['type']}:{config['task']['index']}\"\n"
    "out = sys.argv[1]\n"
    "open(os.path.join(out, f'workers-{n}'), 'a').close()\n"
    "first = not os.path.exists(os.path.join(out, 'done'))\n"
)

#: Like a training script under tfdist.elastic: SIGTERM -> exit 143.
_SAVE_ON_SIGTERM = "signal.signal(signal.SIGTERM, lambda *_: os._exit(143))\n"


def _run(body, workers, out, *, restarts=0, slots_file=None, shape=None, hosts_file=None):
    err = io.StringIO()
    hosts = {}
    if hosts_file is not None:  # Tasks on "hosts", through a stand-in for ssh; they bind no port.
        hosts = {"hosts_file": hosts_file, "remote_shell": remote.RemoteShell(programs.FAKE_RSH), "port": 23400}
    result = restart.run_local_job(
        programs.python(_PRELUDE + body, out),
        shape or job.JobShape(workers.maximum),
        env=dict(os.environ),
        restarts=restarts,
        timeout_s=programs.JOB_BOUND_S,
        min_workers=workers.minimum,
        slots_file=slots_file,
        stdout=io.StringIO(),
        stderr=err,
        **hosts,
    )
    return result, err.getvalue()


def _ends_once(task, how):
    """A body in which task `task` (an expression for its name) ends its first attempt by statement `how`.

    The other tasks of the first attempt wait to be stopped.
    """
    return (
        f"if first and name == {task}:\n"
        "    open(os.path.join(out, 'done'), 'w').close()\n"
        f"    {how}\n"
        "if first:\n"
        "    time.sleep(60)\n"
    )


def _attempts(out):
    return sorted(int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("workers-"))


class WorkerRangeTest(parameterized.TestCase):
    def test_parses_a_count_and_a_range(self):
        self.assertEqual(membership.WorkerRange.parse("3"), membership.WorkerRange(3, 3))
        self.assertFalse(membership.WorkerRange.parse("3").is_elastic)
        self.assertEqual(membership.WorkerRange.parse("2:4"), membership.WorkerRange(2, 4))
        self.assertEqual(str(membership.WorkerRange.parse("2:4")), "2:4")

    @parameterized.parameters(
        ("0", "expected an integer >= 1, received --workers '0'"),
        ("4:2", "1 <= MIN <= MAX.*--workers 4:2"),
        ("two", "a number of workers or MIN:MAX.*'two'"),
        ("1:2:3", "a number of workers or MIN:MAX.*'1:2:3'"),
    )
    def test_bad_text_raises_launcher_error_naming_it(self, text, pattern):
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            membership.WorkerRange.parse(text)

    def test_read_slots(self):
        path = os.path.join(self.create_tempdir().full_path, "slots")
        self.assertIsNone(membership.read_slots(path))
        for text, slots in (("3\n", 3), ("x", None), ("-1", None)):
            with open(path, "w") as f:
                f.write(text)
            self.assertEqual(membership.read_slots(path), slots)


class ElasticJobTest(parameterized.TestCase):
    def test_a_lost_worker_leaves_the_job_one_worker_short(self):
        out = self.create_tempdir().full_path
        body = _ends_once("f'worker:{n - 1}'", 'os.kill(os.getpid(), signal.SIGKILL)')
        result, log = _run(body, membership.WorkerRange(2, 3), out, restarts=1)
        self.assertTrue(result.succeeded, log)
        self.assertEqual(_attempts(out), [2, 3])
        self.assertIn(
            "membership: 3 -> 2 worker(s): task worker:2 was killed by SIGKILL (restart 1/1)", log
        )
        self.assertRegex(log, r"membership: 3 -> 2 worker\(s\) re-formed [\d.]+ s after task worker:2")

    def test_below_the_minimum_the_job_fails_naming_the_lost_task(self):
        out = self.create_tempdir().full_path
        body = "if name == f'worker:{n - 1}':\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(60)\n"
        started = time.monotonic()
        result, log = _run(body, membership.WorkerRange(2, 3), out, restarts=5)
        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual(_attempts(out), [2, 3])
        self.assertIn(
            "task worker:1 was killed by SIGKILL, leaving 1 worker(s), fewer than the 2 the job "
            "needs (--workers 2:3); failing the job",
            log,
        )
        self.assertIsInstance(result.error, errors.TooFewWorkersError)
        self.assertEqual(result.error.task, "worker:1")
        self.assertRegex(result.describe(), r"^TooFewWorkersError: task worker:1 was killed by SIGKILL, "
                                            r"leaving 1 worker\(s\).*lower MIN\.$")
        self.assertLess(time.monotonic() - started, programs.JOB_BOUND_S)

    def test_a_preempted_task_is_relaunched_without_using_a_restart(self):
        out = self.create_tempdir().full_path
        body = _ends_once("'worker:1'", 'os._exit(143)')
        result, log = _run(body, membership.WorkerRange(1, 2), out, restarts=0)
        self.assertTrue(result.succeeded, log)
        self.assertIn("membership: task worker:1 was preempted (saved at a step, exit 143); "
                      "relaunching 2 worker(s)", log)

    def test_the_peers_of_a_preempted_task_may_finish_their_save_before_being_stopped(self):
        # worker:1 (the chief, saving longer) exits 143 a second after
        # worker:0 did: it is not signalled meanwhile.
        out = self.create_tempdir().full_path
        body = _SAVE_ON_SIGTERM + "time.sleep(1.0 if name == 'worker:0' else 0.0)\nos._exit(143)\n"
        result, _ = _run(body, membership.WorkerRange(2, 2), out)
        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual([r.exit_code for r in result.tasks], [143, 143])
        self.assertEqual([r.was_stopped for r in result.tasks], [False, False])

    def test_without_a_range_a_preempted_task_fails_the_job_as_before(self):
        out = self.create_tempdir().full_path
        result, _ = _run("os._exit(143)\n", membership.WorkerRange(2, 2), out, restarts=0)
        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertEqual(result.task_result(result.failed_task).exit_code, 143)

    @parameterized.named_parameters(
        ("slots_file", "slots_file", "{}", "asked for {}"),
        # The tasks' SIGTERM crosses the remote shell: each exits 143, as a
        # task saving at a step does, not killed (then taken for lost).
        ("hosts_file", "hosts_file", "# the job's machines\n127.0.0.1 slots={}\n", "changed"),
    )
    def test_the_file_grows_the_job_at_a_stop_and_shrinks_it(self, kind, text, cause):
        out = self.create_tempdir().full_path
        path = os.path.join(out, kind)
        with open(path, "w") as f:
            f.write(text.format(1))
        # Each attempt's tasks run until stopped; the third ends the job.
        body = _SAVE_ON_SIGTERM + (
            "open(os.path.join(out, f'ready-{n}-{name}'), 'w').close()\n"
            "if n == 2 and os.path.exists(os.path.join(out, 'shrunk')):\n"
            "    sys.exit(0)\n"
            "time.sleep(60)\n"
        )

        def change_file():
            for count, ready in ((3, "ready-1-worker:0"), (2, "ready-3-worker:2")):
                while not os.path.exists(os.path.join(out, ready)):
                    time.sleep(0.05)
                if count == 2:
                    open(os.path.join(out, "shrunk"), "w").close()
                with open(path, "w") as f:
                    f.write(text.format(count))

        changer = threading.Thread(target=change_file, daemon=True)
        changer.start()
        result, log = _run(body, membership.WorkerRange(1, 3), out, **{kind: path})
        changer.join(timeout=1)
        self.assertTrue(result.succeeded, log)
        self.assertEqual(_attempts(out), [1, 2, 3])
        source = kind.replace("_", " ")
        self.assertIn(f"membership: 1 -> 3 worker(s): the {source} {path!r} {cause.format(3)}", log)
        self.assertIn(f"membership: 3 -> 2 worker(s): the {source} {path!r} {cause.format(2)}", log)
        if kind == "hosts_file":
            self.assertIn(
                "starting 3 task(s) on their hosts through "
                f"{shlex.join(programs.FAKE_RSH)}: worker:0=127.0.0.1:23400, "
                "worker:1=127.0.0.1:23401, worker:2=127.0.0.1:23402",
                log,
            )

    def test_a_host_whose_worker_is_lost_is_left_out(self):
        out = self.create_tempdir().full_path
        hosts_file = os.path.join(out, "hosts")
        with open(hosts_file, "w") as f:
            f.write("127.0.0.1\nnode-lost\n")  # The stand-in for ssh cannot reach node-lost.
        result, log = _run("pass\n", membership.WorkerRange(1, 2), out, restarts=1, hosts_file=hosts_file)
        self.assertTrue(result.succeeded, log)
        self.assertEqual(_attempts(out), [1])  # worker:1 never started.
        self.assertIn(
            "membership: 2 -> 1 worker(s): task worker:1 exited with code 255 (host node-lost is left "
            "out until the hosts file drops it) (restart 1/1)",
            log,
        )

    def test_slots_below_the_minimum_stop_the_job_and_fail_it(self):
        out = self.create_tempdir().full_path
        slots = os.path.join(out, "slots")
        with open(slots, "w") as f:
            f.write("2")
        body = _SAVE_ON_SIGTERM + (
            "open(os.path.join(out, f'ready-{name}'), 'w').close()\ntime.sleep(60)\n"
        )

        def drop_slots():
            while not os.path.exists(os.path.join(out, "ready-worker:1")):
                time.sleep(0.05)
            with open(slots, "w") as f:
                f.write("1")

        threading.Thread(target=drop_slots, daemon=True).start()
        result, log = _run(body, membership.WorkerRange(2, 3), out, slots_file=slots)
        self.assertEqual(result.outcome, job.JobOutcome.FAILED)
        self.assertIn(f"the slots file {slots!r} grants 1 worker(s), fewer than the 2 the job needs", log)
        self.assertEqual({r.exit_code for r in result.tasks}, {143})
        self.assertIsInstance(result.error, errors.TooFewWorkersError)
        self.assertIsNone(result.error.task)

    def test_slots_below_the_minimum_at_the_start_raise_launcher_error(self):
        out = self.create_tempdir().full_path
        slots = os.path.join(out, "slots")
        with open(slots, "w") as f:
            f.write("1")
        with self.assertRaisesRegex(errors.LauncherError, r"grants 1 worker\(s\), fewer than the 2"):
            _run("pass\n", membership.WorkerRange(2, 3), out, slots_file=slots)

    def test_a_script_error_is_restarted_on_as_many_workers_not_taken_for_a_loss(self):
        out = self.create_tempdir().full_path
        body = _ends_once("'worker:2'", 'sys.exit(3)')
        result, log = _run(body, membership.WorkerRange(2, 3), out, restarts=1)
        self.assertTrue(result.succeeded, log)
        self.assertEqual(_attempts(out), [3])
        self.assertIn("restart 1/1: task worker:2 exited with code 3", log)

    def test_a_parameter_server_job_grows_with_its_slots_file(self):
        # The chief, ps and evaluator stay; the slots are the workers'.
        out = self.create_tempdir().full_path
        slots = os.path.join(out, "slots")
        with open(slots, "w") as f:
            f.write("1")
        body = _SAVE_ON_SIGTERM + (
            "if name == 'chief:0' and first:\n"
            "    open(os.path.join(out, 'ready'), 'w').close()\n"
            "if name == 'chief:0' and not first:\n"
            "    sys.exit(0)\n"
            "time.sleep(60)\n"
        )

        def grow():
            while not os.path.exists(os.path.join(out, "ready")):
                time.sleep(0.05)
            open(os.path.join(out, "done"), "w").close()
            with open(slots, "w") as f:
                f.write("2")

        threading.Thread(target=grow, daemon=True).start()
        result, log = _run(
            body, membership.WorkerRange(1, 3), out, slots_file=slots,
            shape=job.JobShape(3, num_ps=1, has_chief=True),
        )
        self.assertTrue(result.succeeded, log)
        self.assertEqual(_attempts(out), [1, 2])
        self.assertIn(f"membership: 1 -> 2 worker(s): the slots file {slots!r} asked for 2", log)
        self.assertIn("chief:0=127.0.0.1:", log)
        self.assertEqual({r.task.name for r in result.tasks}, {"chief:0", "worker:0", "worker:1", "ps:0"})

if __name__ == "__main__":
    absltest.main()
