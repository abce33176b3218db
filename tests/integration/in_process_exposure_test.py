"""What a program that starts TensorFlow servers itself exposes on the network.

`tfdist.testing.start_local_ps_cluster` runs a parameter-server cluster's
worker and ps servers inside the calling process, which is how the
examples train with no TF_CONFIG; the chief's tf.data service
(`input_service="chief"`) adds two more servers. TensorFlow's servers
listen on every interface without authentication, so the program first
restarts itself in a private network namespace. While each program below
runs, the test reads the listening sockets the process holds:

- in the test's own network namespace (this host's network): none;
- in the program's namespace (`/proc/PID/net/tcp{,6}`): its servers, in
  a namespace whose only interface is loopback.

On a tfdist without the restart, the first check fails: every server
listens at `*:PORT` on this host's network.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from absl.testing import absltest

import tfdist.testing
from tests import forked_script
from tests.unit.launch import sockets

pytestmark = [pytest.mark.multiprocess]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Starts a cluster of 1 worker and 1 ps in this process, builds the chief's
# strategy, prints its pid, then serves until killed.
_SERVE = """
import os, threading
import tfdist
print("started", os.getpid(), flush=True)
config = tfdist.testing.start_local_ps_cluster(num_workers=1, num_ps=1)
strategy = tfdist.ParameterServerStrategy(config)
print("serving", os.getpid(), flush=True)
threading.Event().wait()
"""
# Far above the ~10 s a restarted TensorFlow program needs on 2 cores.
_BOUND_S = 150.0
_POLL_S = 0.05


def _env() -> dict[str, str]:
    # This checkout's tfdist, not whichever one is installed.
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))


class _Exposure:
    """The listening sockets a process held, per namespace, sampled while it ran."""

    def __init__(self) -> None:
        self.on_host: set[tuple[int, bool]] = set()
        self.in_own_namespace: set[int] = set()
        self.own_interfaces: set[str] = set()

    def sample(self, pid: int) -> None:
        try:
            owned = sockets.socket_inodes(pid)
            own = sockets.listening(pid)
            interfaces = sockets.interfaces(pid)
        except (FileNotFoundError, ProcessLookupError):  # It has exited.
            return
        self.on_host |= {(s.port, s.is_wildcard) for s in sockets.listening() if s.inode in owned}
        listening_own = {s.port for s in own if s.inode in owned}
        if listening_own:
            self.in_own_namespace |= listening_own
            self.own_interfaces = interfaces


class InProcessExposureTest(absltest.TestCase):

    def assert_private(self, exposure: _Exposure, at_least: int) -> None:
        self.assertEmpty(
            exposure.on_host,
            "the program's servers listened on this host's network (port, every interface?)")
        self.assertGreaterEqual(len(exposure.in_own_namespace), at_least)
        self.assertEqual(exposure.own_interfaces, {"lo"})

    def test_in_process_cluster_serves_only_inside_its_program(self):
        path = self.create_tempfile("serve.py", content=_SERVE).full_path
        script = forked_script.ForkedScript([sys.executable, "-u", path], _env(), cwd=_ROOT)
        self.addCleanup(script.kill, timeout=30)
        deadline = time.monotonic() + _BOUND_S
        while "serving" not in script.stdout:
            self.assertIsNone(script.returncode, f"it exited first:\n{script.stderr[-3000:]}")
            self.assertLess(time.monotonic(), deadline, script.stderr[-3000:])
            time.sleep(_POLL_S)
        exposure = _Exposure()
        exposure.sample(script.pid)
        # The worker's, the ps's and the chief's servers.
        self.assert_private(exposure, at_least=3)
        # Restarted once, same pid, before any server started.
        self.assertEqual(script.stdout.count(f"started {script.pid}"), 2, script.stdout)
        self.assertNotIn("RuntimeWarning", script.stderr)

    def test_example_default_and_its_input_service_serve_only_inside_the_example(self):
        # examples/digits.py with no TF_CONFIG: an in-process cluster of 2
        # workers and 2 ps, the chief serving the input (tf.data service).
        script = forked_script.ForkedScript(
            [sys.executable, "-u", os.path.join(_ROOT, "examples", "digits.py"),
             "--strategy=parameter_server", "--input_service=chief", "--epochs=1", "--steps=2"],
            _env(), cwd=_ROOT)
        self.addCleanup(script.kill, timeout=30)
        exposure = _Exposure()
        deadline = time.monotonic() + _BOUND_S
        while script.returncode is None:
            self.assertLess(time.monotonic(), deadline, script.stderr[-3000:])
            exposure.sample(script.pid)
            time.sleep(_POLL_S)
        self.assertEqual(script.wait(), 0, script.stderr[-3000:])
        self.assertRegex(script.stdout, r"test_accuracy=0\.\d{4} examples_per_second=")
        self.assertIn("replicas=1", script.stdout)
        self.assertEqual(script.stdout.count("No TF_CONFIG cluster"), 1, script.stdout)
        # 2 workers, 2 ps, the chief, the tf.data dispatcher and its worker.
        self.assert_private(exposure, at_least=7)


if __name__ == "__main__":
    tfdist.testing.main()
