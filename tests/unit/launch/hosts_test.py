"""Tests for tfdist.launch.hosts: the cluster of a job on real hosts."""

from __future__ import annotations

from absl.testing import absltest
from absl.testing import parameterized

from tfdist import errors
from tfdist.launch import hosts
from tfdist.launch import job


class ClusterFromHostsTest(parameterized.TestCase):
    def test_hosts_assigned_in_order_chief_workers_ps_evaluator(self):
        cluster = hosts.cluster_from_hosts(
            ["c:1", "w0:1", "w1:1", "p:1", "e:1"],
            job.JobShape(2, num_ps=1, has_chief=True, has_evaluator=True),
        )

        self.assertEqual(
            cluster.to_dict(),
            {
                "chief": ["c:1"],
                "worker": ["w0:1", "w1:1"],
                "ps": ["p:1"],
                "evaluator": ["e:1"],
            },
        )

    @parameterized.named_parameters(
        (
            "too_few",
            ["a:1", "b:1"],
            r"hosts lists 2 address\(es\) but the job has 3 task\(s\)",
        ),
        ("bad_port", ["a:1", "b:x", "c:1"], r"hosts\[1\]='b:x'"),
        ("no_port", ["a:1", "b:1", "c"], r"hosts\[2\]='c'"),
        ("repeated", ["a:1", "b:1", "a:1"], r"hosts\[2\]='a:1' repeats"),
    )
    def test_bad_hosts_raise_launcher_error(self, host_list, pattern):
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            hosts.cluster_from_hosts(host_list, job.JobShape(2, has_chief=True))

    def test_str_hosts_raise_type_error(self):
        with self.assertRaisesRegex(TypeError, r"hosts must be a sequence"):
            hosts.cluster_from_hosts("a:1", job.JobShape(1))


if __name__ == "__main__":
    absltest.main()
