"""tfdist/multi_worker/transport.py's checks before TF's runtime starts (no cluster runs).

Which transport a running job takes, and its check that the tasks share
/dev/shm, are tested on processes: tests/integration/multi_worker_fit_test.py.
"""

from __future__ import annotations

import os
from unittest import mock

from absl.testing import absltest

from tfdist import cluster
from tfdist.collectives import host_memory
from tfdist.multi_worker import transport


def _config(addresses, index):
    return cluster.parse_tf_config(
        {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
    )


class CheckTransportTest(absltest.TestCase):
    """(Its errors through the strategy's constructor: multi_worker_fit_test's MultiWorkerConfigTest.)"""

    def test_auto_and_grpc_accept_several_hosts(self):
        for choice in ("auto", "grpc"):
            transport.check_transport(choice, _config(["node-a:1", "node-b:1"], 0))  # Raises nothing.


class RemoveStaleFilesTest(absltest.TestCase):
    """A crashed job's files on these addresses are removed by the next job's first task, only."""

    def setUp(self):
        super().setUp()
        self.directory = self.create_tempdir().full_path
        self.enter_context(mock.patch.object(host_memory, "DIRECTORY", self.directory))
        addresses = ["127.0.0.1:1", "127.0.0.1:2"]
        self.first, self.second = _config(addresses, 0), _config(addresses, 1)
        prefix = f"tfdist-{transport._fingerprint(self.first)}"  # noqa: SLF001
        self.stale = [os.path.join(self.directory, f"{prefix}-1-{kind}") for kind in ("fifo-0", "slot-0-8-float32")]
        self.other_job = os.path.join(self.directory, "tfdist-0123456789abcdef-1-fifo-0")
        for path in [*self.stale, self.other_job]:
            open(path, "w").close()

    def test_the_first_task_removes_its_clusters_files_and_no_others(self):
        transport.remove_stale_files(self.first, "auto")
        self.assertEqual(os.listdir(self.directory), [os.path.basename(self.other_job)])

    def test_other_tasks_and_grpc_leave_them(self):
        transport.remove_stale_files(self.second, "auto")
        transport.remove_stale_files(self.first, "grpc")
        self.assertLen(os.listdir(self.directory), 3)


if __name__ == "__main__":
    absltest.main()
