"""Tests for tfdist.launch.isolation: jobs in a private network namespace.

The task programs here bind their TF_CONFIG port as TensorFlow's gRPC
server does (`[::]:PORT`, dual stack: every interface), so what the
sockets look like is what a TensorFlow job's look like; the integration
test tests/integration/network_exposure_test.py checks TensorFlow's own
servers. These tests need Linux network namespaces (root, or unprivileged
user namespaces) and skip, saying why, where the OS refuses them.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from tests.unit.launch import programs
from tests.unit.launch import sockets
from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import isolation
from tfdist.launch import job
from tfdist.launch import ports
from tfdist.launch import supervisor

# worker:0: listens on its TF_CONFIG port on every interface, as gRPC
# does, then lets worker:1 connect (FIFO argv[1]/up) and waits for the test
# (its own FIFO argv[1]/done-0).
_SERVER = """
import json, os, socket, sys
address = json.loads(os.environ['TF_CONFIG'])['cluster']['worker'][0]
port = int(address.rsplit(':', 1)[1])
try:
    server = socket.socket(socket.AF_INET6)
    server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    server.bind(('::', port))
except OSError:  # No IPv6: what gRPC falls back to.
    server = socket.socket()
    server.bind(('0.0.0.0', port))
server.listen()
print('listening', os.getpid(), port, flush=True)
open(os.path.join(sys.argv[1], 'up'), 'w').close()
open(os.path.join(sys.argv[1], 'done-0')).read()
"""
# worker:1: connects to worker:0 at its TF_CONFIG address, 127.0.0.1:PORT.
_CLIENT = """
import json, os, socket, sys
address = json.loads(os.environ['TF_CONFIG'])['cluster']['worker'][0]
open(os.path.join(sys.argv[1], 'up')).read()
host, port = address.rsplit(':', 1)
socket.create_connection((host, int(port))).close()
print('connected', os.getpid(), flush=True)
open(os.path.join(sys.argv[1], 'done-1')).read()
"""


class _RunningJob:
    """A two-worker server/client job, run in a thread while a test looks."""

    def __init__(self, test: absltest.TestCase, *, isolate: bool) -> None:
        self._fifos = programs.make_fifos(test, "up", "done-0", "done-1")
        self._out = programs.ReadySink("connected", count=1)
        self._job = supervisor.LocalJob(
            ports.make_local_cluster(job.JobShape(2)),
            programs.python(
                programs.by_task({"worker:0": _SERVER, "worker:1": _CLIENT}),
                self._fifos,
            ),
            env=dict(os.environ),
            isolate=isolate,
            stdout=self._out,
            stderr=io.StringIO(),
        )
        self._results: list[job.JobResult] = []
        self._thread = threading.Thread(
            target=lambda: self._results.append(
                self._job.run(timeout_s=programs.JOB_BOUND_S)
            )
        )
        self._thread.start()
        test.addCleanup(self._stop)
        if not self._out.ready.wait(programs.JOB_BOUND_S):
            raise AssertionError(f"the tasks never connected: {self._out}")
        # Each task's output reaches the sink through its own reader thread:
        # under load worker:0's line can land after worker:1's (seen once).
        deadline = time.monotonic() + programs.JOB_BOUND_S
        while "[worker:0] listening" not in self._out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        text = self._out.getvalue()
        server = re.search(r"\[worker:0\] listening (\d+) (\d+)", text)
        client = re.search(r"\[worker:1\] connected (\d+)", text)
        assert server is not None and client is not None, text
        self.server_pid, self.port = int(server[1]), int(server[2])
        self.client_pid = int(client[1])

    def finish(self) -> job.JobResult:
        """Lets both tasks exit 0; returns the job's result."""
        for name in ("done-0", "done-1"):  # Each blocks until its task reads.
            with open(os.path.join(self._fifos, name), "w"):
                pass
        self._thread.join(programs.JOB_BOUND_S)
        (result,) = self._results
        return result

    def _stop(self) -> None:
        if self._thread.is_alive():  # A failed test: end the job now.
            self._job.request_stop(9)
            self._thread.join(programs.JOB_BOUND_S)


def _reachable_from_here(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    except ConnectionRefusedError:
        return False
    return True


class IsolatedJobTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        programs.skip_without_network_namespaces(self)

    def test_tasks_share_one_private_namespace_and_reach_each_other(self):
        running = _RunningJob(self, isolate=True)

        namespace = sockets.network_namespace(running.server_pid)
        self.assertEqual(
            sockets.network_namespace(running.client_pid), namespace
        )  # worker:1 connected to worker:0 over the namespace's loopback.
        self.assertNotEqual(namespace, sockets.network_namespace())
        self.assertEqual(sockets.interfaces(running.server_pid), {"lo"})
        self.assertTrue(running.finish().is_isolated)

    def test_server_on_every_interface_is_unreachable_from_outside(self):
        running = _RunningJob(self, isolate=True)

        inside = sockets.listening(running.server_pid)
        outside = sockets.listening()
        # It listens on every interface of its namespace, which has only
        # its own loopback; this (any other) namespace has no such socket,
        # and a connection to the port from here is refused.
        self.assertIn(running.port, [s.port for s in inside if s.is_wildcard])
        self.assertNotIn(running.port, [s.port for s in outside])
        self.assertFalse(_reachable_from_here(running.port))
        self.assertTrue(running.finish().succeeded)


class HostNetworkJobTest(absltest.TestCase):
    def test_without_isolation_the_server_listens_on_every_host_interface(
        self,
    ):
        running = _RunningJob(self, isolate=False)

        self.assertEqual(
            sockets.network_namespace(running.server_pid),
            sockets.network_namespace(),
        )
        wildcard = [s.port for s in sockets.listening() if s.is_wildcard]
        self.assertIn(running.port, wildcard)
        self.assertTrue(_reachable_from_here(running.port))
        self.assertFalse(running.finish().is_isolated)


class PrivateNetworkTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        programs.skip_without_network_namespaces(self)

    def test_wrapped_command_runs_in_a_namespace_with_loopback_up(self):
        code = (
            "import os, socket\n"
            "server = socket.create_server(('127.0.0.1', 0))\n"
            "socket.create_connection(server.getsockname()).close()\n"
            "print(os.readlink('/proc/self/ns/net'))\n"
        )
        with isolation.PrivateNetwork.create() as network:
            argv, fds = network.wrap(sys.executable, programs.python(code))
            result = subprocess.run(
                argv,
                pass_fds=fds,
                capture_output=True,
                text=True,
                timeout=programs.JOB_BOUND_S,
                check=False,
            )

        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotEqual(result.stdout.strip(), sockets.network_namespace())

    def test_missing_program_exits_127_with_a_message(self):
        with isolation.PrivateNetwork.create() as network:
            argv, fds = network.wrap("/nonexistent/program", ["program"])
            result = subprocess.run(
                argv, pass_fds=fds, capture_output=True, text=True, check=False
            )

        self.assertEqual(result.returncode, 127)
        self.assertIn("cannot run /nonexistent/program", result.stderr)

    def test_wrap_after_close_raises_runtime_error(self):
        network = isolation.PrivateNetwork.create()
        network.close()

        with self.assertRaisesRegex(RuntimeError, r"after close"):
            network.wrap(sys.executable, [sys.executable])


class ShouldIsolateTest(parameterized.TestCase):
    def _decide(self, isolate, reason):
        notices = []
        with mock.patch.object(
            isolation, "unavailable_reason", return_value=reason
        ):
            decision = isolation.should_isolate(isolate, report=notices.append)
        return decision, notices

    @parameterized.named_parameters(
        ("default_available", None, None, True),
        ("required_available", True, None, True),
        ("off_available", False, None, False),
        ("off_unavailable", False, "no namespaces here.", False),
    )
    def test_decides_without_notice(self, isolate, reason, expected):
        self.assertEqual(self._decide(isolate, reason), (expected, []))

    def test_default_when_unavailable_gives_one_notice_and_host_network(self):
        decision, notices = self._decide(None, "no namespaces here.")

        self.assertFalse(decision)
        (notice,) = notices
        self.assertIn("not isolated: no namespaces here.", notice)
        self.assertIn("listen on every interface", notice)

    def test_required_when_unavailable_raises_launcher_error(self):
        with self.assertRaisesRegex(errors.LauncherError, r"no namespaces"):
            self._decide(True, "no namespaces here.")

    def test_local_job_default_warns_when_unavailable(self):
        local_job = supervisor.LocalJob(
            ports.make_local_cluster(job.JobShape(1)),
            programs.python("pass"),
            env=dict(os.environ),
        )
        with mock.patch.object(
            isolation, "unavailable_reason", return_value="no namespaces."
        ):
            with self.assertWarnsRegex(RuntimeWarning, r"not isolated"):
                result = local_job.run(timeout_s=programs.JOB_BOUND_S)

        self.assertTrue(result.succeeded)
        self.assertFalse(result.is_isolated)

    def test_bad_isolate_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, r"isolate must be True"):
            supervisor.LocalJob(
                spec.ClusterSpec({"worker": ["127.0.0.1:1"]}),
                ["true"],
                env={},
                isolate="yes",  # type: ignore[arg-type]
            )


class RefusedNamespacesTest(absltest.TestCase):
    """The launcher under an OS that refuses network namespaces.

    `unshare --user --map-root-user` gives the launcher a user namespace of
    its own whose limit on network namespaces is set to 0, so creating one
    fails there as in a locked-down container.
    """

    _REFUSE = "echo 0 > /proc/sys/user/max_net_namespaces"

    def setUp(self):
        super().setUp()
        if shutil.which("unshare") is None:
            self.skipTest("needs util-linux's `unshare` to refuse namespaces")
        probe = subprocess.run(
            ["unshare", "--user", "--map-root-user", "sh", "-c", self._REFUSE],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode:
            self.skipTest(f"cannot create a user namespace: {probe.stderr}")

    def test_launcher_says_so_once_and_carries_on(self):
        marker = os.path.join(self.create_tempdir().full_path, "failed-once")
        result = subprocess.run(
            [
                "unshare", "--user", "--map-root-user", "sh", "-c",
                f'{self._REFUSE} && exec "$0" "$@"',
                sys.executable, "-m", "tfdist.launch", "--workers", "1",
                "--restarts", "1", "--",
                *programs.python(programs.FAIL_ONCE, marker),
            ],
            capture_output=True,
            text=True,
            timeout=programs.JOB_BOUND_S,
            check=False,
        )  # fmt: skip

        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr.count("not isolated"), 1, result.stderr)
        self.assertIn("No space left on device", result.stderr)
        self.assertEqual(
            result.stderr.count("starting 1 task(s) on this host's network"),
            2,
        )  # The first attempt and the restart.


class NetworkIsPrivateTest(absltest.TestCase):

    def test_true_inside_a_private_namespace_and_as_the_interfaces_say_here(self):
        programs.skip_without_network_namespaces(self)
        root = os.path.dirname(os.path.dirname(os.path.dirname(isolation.__file__)))
        code = (
            f"import sys\nsys.path.insert(0, {root!r})\n"  # This checkout's tfdist.
            "from tfdist.launch import isolation\n"
            "print(isolation.network_is_private())\n"
        )
        with isolation.PrivateNetwork.create() as network:
            argv, fds = network.wrap(sys.executable, programs.python(code))
            result = subprocess.run(
                argv, pass_fds=fds, capture_output=True, text=True,
                timeout=programs.JOB_BOUND_S, check=False)
        self.assertEqual(result.stdout.strip(), "True", result.stderr)
        self.assertEqual(isolation.network_is_private(), sockets.interfaces() == {"lo"})


class _ProcessState(absltest.TestCase):
    """Each test starts with no notice given and the host's network."""

    def setUp(self):
        super().setUp()
        self.enter_context(mock.patch.object(isolation, "_reported", set()))
        self.enter_context(mock.patch.dict(os.environ))
        os.environ.pop(isolation.NOTICE_GIVEN_ENV, None)
        self.enter_context(
            mock.patch.object(isolation, "network_is_private", return_value=False))
        self.notices = []


class RestartInPrivateNetworkTest(_ProcessState):
    """What `restart_in_private_network` decides; the restart itself:
    tests/integration/in_process_exposure_test.py."""

    def restart(self, isolate):
        isolation.restart_in_private_network(
            isolate, what="start_local_ps_cluster", report=self.notices.append)

    def test_isolate_false_returns_and_silences_later_notices(self):
        self.restart(False)
        isolation.report_local_exposure(
            ["127.0.0.1:1"], what="a strategy", report=self.notices.append)
        self.assertEmpty(self.notices)

    def test_a_private_network_needs_no_restart(self):
        with mock.patch.object(isolation, "network_is_private", return_value=True):
            self.restart(True)
        self.assertEmpty(self.notices)

    def test_an_interactive_session_gets_one_notice_by_default(self):
        with mock.patch.object(sys, "ps1", ">>> ", create=True):
            self.restart(None)
            self.restart(None)
        self.assertLen(self.notices, 1)
        self.assertRegex(
            self.notices[0],
            r"not isolated: start_local_ps_cluster cannot isolate this process: "
            r"an interactive session .* listen on every interface")

    def test_an_os_without_namespaces_gets_one_notice_by_default(self):
        refused = errors.LauncherError("cannot create a private network namespace (no)")
        with mock.patch.object(isolation.PrivateNetwork, "create", side_effect=refused):
            self.restart(None)
            self.restart(None)
            with self.assertRaisesRegex(errors.LauncherError, r"cannot create a private network namespace"):
                self.restart(True)
        self.assertLen(self.notices, 1)
        self.assertIn("not isolated: start_local_ps_cluster cannot isolate this process: cannot create",
                      self.notices[0])

    def test_an_interactive_session_with_isolate_true_raises(self):
        with mock.patch.object(sys, "ps1", ">>> ", create=True), self.assertRaisesRegex(
                errors.LauncherError, r"interactive session.*tfdist.launch.*isolate=False"):
            self.restart(True)

    def test_a_restarted_program_still_on_the_host_network_raises_instead_of_looping(self):
        with mock.patch.dict(os.environ, {"TFDIST_RESTARTED_IN_PRIVATE_NETWORK": "1"}):
            with self.assertRaisesRegex(errors.LauncherError, r"still has interfaces other than loopback"):
                self.restart(None)

    def test_bad_isolate_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, r"isolate='yes'"):
            self.restart("yes")


class ReportLocalExposureTest(_ProcessState):

    def report(self, addresses):
        isolation.report_local_exposure(addresses, what="a strategy", report=self.notices.append)

    def test_a_local_cluster_on_the_host_network_gets_one_notice(self):
        self.report(["127.0.0.1:2000", "localhost:2001", "[::1]:2002"])
        self.report(["127.0.0.1:2000"])
        self.assertLen(self.notices, 1)
        self.assertRegex(self.notices[0], r"a strategy runs on a cluster of this host.*tfdist.launch")

    def test_no_notice_where_none_is_due(self):
        for case, addresses, environ, private in (
            ("other hosts", ["127.0.0.1:2000", "10.0.0.2:2000"], {}, False),
            ("the launcher told the user", ["127.0.0.1:2000"], {isolation.NOTICE_GIVEN_ENV: "1"}, False),
            ("a private network", ["127.0.0.1:2000"], {}, True),
        ):
            with self.subTest(case), mock.patch.dict(os.environ, environ), mock.patch.object(
                    isolation, "network_is_private", return_value=private):
                self.report(addresses)
        self.assertEmpty(self.notices)

    def test_a_launcher_tells_its_unisolated_tasks_it_gave_the_notice(self):
        code = f"import os\nprint(os.environ.get({isolation.NOTICE_GIVEN_ENV!r}))\n"
        for isolate, expected in ((False, "1"), (True, "None")):
            if isolate:
                programs.skip_without_network_namespaces(self)
            out = io.StringIO()
            local_job = supervisor.LocalJob(
                ports.make_local_cluster(job.JobShape(1)), programs.python(code),
                env=dict(os.environ), isolate=isolate, stdout=out)
            self.assertTrue(local_job.run(timeout_s=programs.JOB_BOUND_S).succeeded)
            with self.subTest(isolate=isolate):
                self.assertEqual(out.getvalue().split()[-1], expected)


if __name__ == "__main__":
    absltest.main()
