"""Tests for tfdist.launch.hosts: the cluster of a job on real hosts, and hosts files."""

from __future__ import annotations

import os

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


class HostsFileTest(parameterized.TestCase):
    def test_parses_mpi_and_horovod_entries_in_order(self):
        text = "# the job's machines\n10.0.0.1 slots=2\n\nnode-b:3  # a comment\nnode-c\n"
        self.assertEqual(
            hosts.parse_hosts(text),
            (hosts.Host("10.0.0.1", 2), hosts.Host("node-b", 3), hosts.Host("node-c", 1)),
        )

    @parameterized.named_parameters(
        ("no_slots", "a slots=0", r"f, line 1: 'a slots=0' grants 0 slots; expected N >= 1"),
        ("both_forms", "a\nb:1 slots=2", r"f, line 2: 'b:1 slots=2' is not a host entry"),
        ("two_words", "a b", r"f, line 1: 'a b' is not a host entry; expected 'HOST slots=N'"),
        ("twice", "a:2\nA", r"f, line 2: 'A' lists 'A' a second time"),
        ("bad_host", "me@a:1", r"f, line 1: 'me@a:1': .*'me@a', which is not a host name"),
        ("option_like", "-Fevil slots=1", r"f, line 1: '-Fevil slots=1': host '-Fevil' starts with '-'"),
    )
    def test_bad_lines_raise_launcher_error_naming_the_line(self, text, pattern):
        with self.assertRaisesRegex(errors.LauncherError, pattern):
            hosts.parse_hosts(text, "f")

    def test_tasks_fill_the_slots_in_order_each_host_counting_its_ports(self):
        listed = hosts.parse_hosts("h0 slots=2\nh1 slots=3\nh2")
        placement = hosts.place(listed, job.JobShape(3, num_ps=1, has_chief=True), port=2222)
        self.assertEqual(
            placement.cluster().to_dict(),
            {"chief": ["h0:2222"], "worker": ["h0:2223", "h1:2222", "h1:2223"], "ps": ["h1:2224"]},
        )
        self.assertEqual(placement.host_of(job.JobShape(3).tasks()[2]), "h1")
        # The workers beside the chief and the ps task.
        self.assertEqual(hosts.worker_slots(listed, placement.shape), 4)
        left_out = hosts.place(listed, job.JobShape(2), port=2222, left_out=frozenset({"h0"}))
        self.assertEqual(left_out.hosts, ("h1", "h1"))

    def test_too_few_slots_or_ports_raise_launcher_error(self):
        listed = hosts.parse_hosts("h0 slots=2\nh1")
        with self.assertRaisesRegex(
            errors.LauncherError, r"the hosts \(leaving out h1\) give 2 slot\(s\), fewer than the 3"
        ):
            hosts.place(listed, job.JobShape(3), port=2222, left_out=frozenset({"h1"}))
        with self.assertRaisesRegex(errors.LauncherError, r"--port 65535 leaves no room.*65536"):
            hosts.place(listed, job.JobShape(2), port=65535)

    def test_a_left_out_host_returns_once_the_file_has_dropped_it(self):
        path = os.path.join(self.create_tempdir().full_path, "hosts")
        write = lambda text: open(path, "w").write(text)  # noqa: E731
        write("h0 slots=2\nh1 slots=2\n")
        listed = hosts.HostsFile(path, job.JobShape(4), port=2222)
        self.assertEqual(listed.workers(), 4)
        listed.leave_out("h1")
        self.assertEqual((listed.workers(), listed.grant()), (2, ("h0", "h0")))
        write("h0 slots=2\nh1 slots=2\nh2\n")
        self.assertEqual(listed.grant(), ("h0", "h0", "h2"))  # h1 still left out.
        write("h0 slots=2\n")
        self.assertEqual(listed.grant(), ("h0", "h0"))
        write("h0 slots=2\nh1 slots=2\n")  # Repaired and listed again.
        self.assertEqual(listed.grant(), ("h0", "h0", "h1", "h1"))
        self.assertEqual(listed.left_out, frozenset())
        for text in ("h0 slots=x\n", ""):  # Being rewritten: no grant, the last list stays.
            write(text)
            self.assertIsNone(listed.grant())
            listed.refresh()
            self.assertEqual(listed.workers(), 4)
        write("h1 slots=2\n")
        listed.leave_out("h1")
        self.assertEqual(listed.grant(), ())  # Listed, but no slot to use.

    def test_an_unreadable_file_raises_launcher_error(self):
        with self.assertRaisesRegex(errors.LauncherError, r"cannot read the hosts file '/nonexistent/hosts'"):
            hosts.HostsFile("/nonexistent/hosts", job.JobShape(1), port=2222)


if __name__ == "__main__":
    absltest.main()
