"""tfdist/multi_worker/transport.py's check before TF's runtime starts (no cluster runs).

Which transport a running job takes, and its check that the tasks share
/dev/shm, are tested on processes: tests/integration/multi_worker_fit_test.py.
"""

from __future__ import annotations

from absl.testing import absltest

from tfdist import cluster
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


if __name__ == "__main__":
    absltest.main()
