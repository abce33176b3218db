"""What a `tfdist-launch` job exposes on the network, with TensorFlow's servers.

Each task of a 2-worker job starts TensorFlow's gRPC server for its task
(`tf.distribute.Server`, as every multi-worker strategy does); worker:0
also starts a tf.data service dispatcher on a port of its own, as a chief
serving input does. While they serve, the test reads the listening sockets
(/proc/net/tcp{,6}) of the task processes:

- isolated (the default): the servers listen in a network namespace whose
  only interface is its loopback; no other namespace sees them, and
  connections from this host are refused;
- `--no-isolate`: what docs/security.md says: every socket of
  every task listens on every interface of the host (`*:PORT`), reachable
  at any of the host's addresses.
"""

from __future__ import annotations

import queue
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest
from absl.testing import absltest

import tfdist.testing
from tests.unit.launch import programs
from tests.unit.launch import sockets
from tfdist import launch  # noqa: F401 - run as `python -m tfdist.launch`; Bazel ships it

pytestmark = [pytest.mark.multiprocess]

# Each task: TensorFlow's server for its task, and on worker:0 a tf.data
# service dispatcher too; prints its pid once both listen, then serves.
_SERVE = """
import json, os, signal, threading
import tensorflow as tf
config = json.loads(os.environ['TF_CONFIG'])
task = config['task']
server = tf.distribute.Server(
    tf.train.ClusterSpec(config['cluster']), job_name=task['type'],
    task_index=task['index'], protocol='grpc', start=True)
if task['index'] == 0:
    dispatcher = tf.data.experimental.service.DispatchServer()
signal.signal(signal.SIGINT, signal.SIG_DFL)
print('serving', os.getpid(), flush=True)
threading.Event().wait()
"""
# Far above the ~10 s two TensorFlow tasks need to start on 2 cores.
_BOUND_S = 150.0


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def _host_addresses() -> list[str]:
    """127.0.0.1 and, if this host has one, its outgoing IPv4 address."""
    addresses = ["127.0.0.1"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1; sends nothing.
            addresses.append(probe.getsockname()[0])
        except OSError:  # No route off this host.
            pass
    return addresses


def _accepts(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=10).close()
    except OSError:
        return False
    return True


class _ServingJob:
    """`python -m tfdist.launch --workers 2 --preload tensorflow [flags]` serving until stopped."""

    def __init__(self, test: absltest.TestCase, *flags: str) -> None:
        # A script, so that each task is forked from a template that imported TF.
        serve = test.create_tempfile("serve.py", _SERVE).full_path
        self._process = subprocess.Popen(
            [
                sys.executable, "-m", "tfdist.launch", "--workers", "2",
                "--grace-period-s", "20", "--preload", "tensorflow", *flags,
                "--", sys.executable, serve,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        test.addCleanup(self._process.kill)
        lines: queue.Queue = queue.Queue()
        self._errors: queue.Queue = queue.Queue()
        for stream, sink in (
            (self._process.stdout, lines),
            (self._process.stderr, self._errors),
        ):
            threading.Thread(
                target=_read_lines, args=(stream, sink), daemon=True
            ).start()
        self.pids: list[int] = []
        while len(self.pids) < 2:
            line = lines.get(timeout=_BOUND_S)
            if line is None:
                raise AssertionError(
                    f"the launcher exited first:\n{self._stderr()}"
                )
            match = re.match(r"\[worker:\d\] serving (\d+)", line)
            if match:
                self.pids.append(int(match[1]))

    def listening(self) -> list[sockets.ListeningSocket]:
        """The listening sockets the tasks hold, read in their namespace."""
        owned = set().union(*(sockets.socket_inodes(p) for p in self.pids))
        return [s for s in sockets.listening(self.pids[0]) if s.inode in owned]

    def stop(self) -> str:
        """Ends the job with Ctrl-C; returns the launcher's stderr."""
        self._process.send_signal(signal.SIGINT)
        status = self._process.wait(timeout=_BOUND_S)
        err = self._stderr()
        assert status == 130, err
        return err

    def _stderr(self) -> str:
        """All the launcher wrote to stderr, once it has closed the pipe."""
        text = []
        while (line := self._errors.get(timeout=_BOUND_S)) is not None:
            text.append(line)
        return "".join(text)


class NetworkExposureTest(absltest.TestCase):
    def _assert_accepted_at_every_host_address(
        self, served: list[sockets.ListeningSocket], *, accepted: bool
    ) -> None:
        for listening_socket in served:
            for address in _host_addresses():
                with self.subTest(address=address, port=listening_socket.port):
                    self.assertEqual(
                        _accepts(address, listening_socket.port), accepted
                    )

    def test_isolated_servers_are_unreachable_from_other_namespaces(self):
        programs.skip_without_network_namespaces(self)
        job = _ServingJob(self)

        served = job.listening()
        namespace = sockets.network_namespace(job.pids[0])
        host_ports = {s.port for s in sockets.listening()}

        # Two gRPC servers and the dispatcher, each on every interface of
        # a namespace that has only its own loopback, shared by both tasks.
        self.assertGreaterEqual(len({s.port for s in served}), 3, served)
        self.assertNotEqual(namespace, sockets.network_namespace())
        self.assertEqual(sockets.network_namespace(job.pids[1]), namespace)
        self.assertEqual(sockets.interfaces(job.pids[0]), {"lo"})
        self.assertEmpty({s.port for s in served} & host_ports)
        self._assert_accepted_at_every_host_address(served, accepted=False)
        self.assertIn("in a private network namespace", job.stop())

    def test_unisolated_servers_listen_on_every_host_interface(self):
        job = _ServingJob(self, "--no-isolate")

        served = job.listening()

        self.assertEqual(
            sockets.network_namespace(job.pids[0]), sockets.network_namespace()
        )
        self.assertGreaterEqual(len({s.port for s in served}), 3, served)
        self.assertEqual([s for s in served if not s.is_wildcard], [])
        self._assert_accepted_at_every_host_address(served, accepted=True)
        self.assertIn("on this host's network", job.stop())


if __name__ == "__main__":
    tfdist.testing.main()
