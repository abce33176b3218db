"""A parameter-server job's serving task after SIGTERM: it serves until the chief is gone, then exits 143.

The task (`serving_task_script.py`, the ps task of a chief, a worker and a
ps) runs alone; the chief is a socket this test listens on, closed when
the test says the chief has gone. A chief stopped by the same notice
(`tfdist.elastic.Elastic`) saves from the ps tasks before they go:
tests/integration/elastic_test.py runs that job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

import pytest
from absl.testing import absltest

import tfdist
from tests import forked_script
from tests.integration import serving_task_script
from tfdist.cluster import tf_config as tf_config_lib
from tfdist.launch import ports
from tfdist.parameter_server import serving_notice

pytestmark = [pytest.mark.multiprocess]

SCRIPT = os.path.abspath(serving_task_script.__file__)
#: Bound on the task's start and on each exit awaited, seconds.
_BOUND_S = 60.0
#: How long the task is watched serving on after SIGTERM, seconds (its check
#: of the chief runs every 0.25 s).
_SERVES_ON_S = 1.5


def _catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a SIGTERM handler (Linux: its caught-signals mask)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def _accepts(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


class ServingTaskSigtermTest(absltest.TestCase):

    def setUp(self):
        super().setUp()
        self.chief = socket.create_server((ports.LOCAL_HOST, 0))  # The chief, listening.
        self.addCleanup(self.chief.close)
        chief = f"{ports.LOCAL_HOST}:{self.chief.getsockname()[1]}"
        self.ps = ports.free_local_address()
        tf_config = {
            "cluster": {"chief": [chief], "worker": [ports.free_local_address()], "ps": [self.ps]},
            "task": {"type": "ps", "index": 0},
        }
        config = tf_config_lib.parse_tf_config(tf_config)
        self.notice = serving_notice.path(config, config.task)
        env = dict(os.environ, TF_CONFIG=json.dumps(tf_config), TF_NUM_INTRAOP_THREADS="1")
        self.task = forked_script.ForkedScript(
            [sys.executable, "-u", SCRIPT], env, cwd=os.getcwd(), keep_stdout=False)
        self.addCleanup(self.task.kill, timeout=_BOUND_S)
        # Serving, and past the moment its SIGTERM handler is installed.
        deadline = time.monotonic() + _BOUND_S
        while not (_accepts(self.ps) and _catches_sigterm(self.task.pid)):
            if self.task.returncode is not None or time.monotonic() > deadline:
                self.fail(f"the ps task did not start serving:\n{self.task.stderr[-3000:]}")
            time.sleep(0.1)

    def test_sigterm_serves_on_while_the_chief_is_there_then_exits_143(self):
        self.assertFalse(os.path.exists(self.notice))
        os.kill(self.task.pid, signal.SIGTERM)
        # Posted where the chief's Elastic looks (serving_notice), on this host:
        # awaited, not assumed after a fixed time (a loaded CI run took over
        # _SERVES_ON_S to run the handler).
        deadline = time.monotonic() + _BOUND_S
        while not os.path.exists(self.notice):
            if self.task.returncode is not None or time.monotonic() > deadline:
                self.fail(f"no notice at {self.notice}:\n{self.task.stderr[-3000:]}")
            time.sleep(0.05)
        time.sleep(_SERVES_ON_S)  # Several checks of the chief, which is still there.
        self.assertIsNone(self.task.returncode, self.task.stderr[-3000:])
        self.assertTrue(_accepts(self.ps))
        self.assertTrue(os.path.exists(self.notice))
        self.chief.close()  # The chief has exited.
        self.assertEqual(self.task.wait(_BOUND_S), tfdist.errors.PREEMPTED_EXIT_CODE)
        self.assertIn("task ps:0 received SIGTERM; it serves until the chief has exited", self.task.stderr)
        self.assertFalse(os.path.exists(self.notice))  # The next job on these ports starts clean.

    def test_a_second_sigterm_exits_143_at_once(self):
        os.kill(self.task.pid, signal.SIGTERM)
        time.sleep(_SERVES_ON_S)
        self.assertIsNone(self.task.returncode, self.task.stderr[-3000:])
        os.kill(self.task.pid, signal.SIGTERM)
        self.assertEqual(self.task.wait(_BOUND_S), tfdist.errors.PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
    tfdist.testing.main()
