"""Tests for tfdist.launch.ports: free, distinct loopback ports."""

from __future__ import annotations

import socket
from unittest import mock

import portpicker
from absl.testing import absltest

from tfdist import errors
from tfdist.cluster import spec
from tfdist.launch import job
from tfdist.launch import ports as ports_lib


def _ports(cluster: spec.ClusterSpec) -> list[int]:
    return [
        spec.Address.parse(cluster.address(task)).port
        for task in cluster.tasks()
    ]


class MakeLocalClusterTest(absltest.TestCase):
    def test_tasks_in_job_order_on_loopback_with_every_job(self):
        cluster = ports_lib.make_local_cluster(
            job.JobShape(2, num_ps=1, has_chief=True, has_evaluator=True)
        )

        self.assertEqual(
            [t.name for t in cluster.tasks()],
            ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"],
        )
        hosts = {
            spec.Address.parse(cluster.address(t)).host for t in cluster.tasks()
        }
        self.assertEqual(hosts, {"127.0.0.1"})

    def test_ports_are_distinct_and_bindable_after_return(self):
        cluster = ports_lib.make_local_cluster(
            job.JobShape(3, num_ps=2, has_chief=True)
        )

        ports = _ports(cluster)
        self.assertLen(set(ports), 6)
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))  # Raises if still held.

    def test_never_hands_out_a_port_bound_by_another_socket(self):
        real_pick = portpicker.pick_unused_port
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            held_port = held.getsockname()[1]
            free_port = real_pick()
            # The held port twice, then a free one twice (a duplicate), then
            # whatever portpicker finds.
            candidates = iter([held_port, held_port, free_port, free_port])
            with mock.patch.object(
                portpicker,
                "pick_unused_port",
                side_effect=lambda: next(candidates, None) or real_pick(),
            ):
                cluster = ports_lib.make_local_cluster(job.JobShape(2))

        ports = _ports(cluster)
        self.assertNotIn(held_port, ports)
        self.assertEqual(ports[0], free_port)
        self.assertLen(set(ports), 2)

    def test_raises_launcher_error_when_every_candidate_is_bound(self):
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held_port = held.getsockname()[1]
            with mock.patch.object(
                portpicker, "pick_unused_port", return_value=held_port
            ):
                with self.assertRaisesRegex(
                    errors.LauncherError, r"found only 0 of the 1 free"
                ):
                    ports_lib.make_local_cluster(job.JobShape(1))

    def test_shape_of_wrong_type_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, r"shape must be a JobShape"):
            ports_lib.make_local_cluster(2)  # type: ignore[arg-type]


if __name__ == "__main__":
    absltest.main()
