"""tfdist.ParameterServerStrategy: bad input and start-up, before any training.

Every bad argument or cluster is refused with a tfdist error naming the
value and the fix, before the strategy starts a server or connects (the
clusters here point at ports nothing listens on, so a check that came too
late would show up as a start-up error instead). Start-up with a missing
task ends in `WorkerUnavailableError` naming it, within `timeout_s`.
Training itself needs a cluster and runs in tests/integration.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

import tfdist
from tfdist import errors
from tfdist import launch
from tfdist.launch import isolation

# Start-up bound used here, and the slack a slow machine may add to it.
TIMEOUT_S = 2.0
MARGIN_S = 10.0


def _tf_config(
    jobs: dict[str, int], task: tuple[str, int] = ("chief", 0)
) -> dict[str, object]:
    """TF_CONFIG of a cluster on free loopback ports (nothing listens there)."""
    shape = launch.JobShape(
        jobs.get("worker", 0) or 1,
        num_ps=jobs.get("ps", 0),
        has_chief=bool(jobs.get("chief")),
    )
    cluster = launch.make_local_cluster(shape).to_dict()
    if not jobs.get("worker"):
        cluster.pop("worker")
    if jobs.get("chief", 0) > 1:
        cluster["chief"] = cluster["chief"] * jobs["chief"]
    return {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}


PS_CLUSTER = {"chief": 1, "worker": 2, "ps": 1}


class BadArgumentTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("unknown_mode", {"mode": "semi-sync"}, "mode='semi-sync'"),
        ("mode_case", {"mode": "Async"}, "mode='Async'"),
        ("negative_staleness", {"max_staleness": -1}, "max_staleness=-1"),
        (
            "staleness_in_sync_mode",
            {"mode": "sync", "max_staleness": 2},
            "max_staleness=2",
        ),
        ("zero_timeout", {"timeout_s": 0}, "timeout_s=0"),
        ("unknown_input_service", {"input_service": "local"}, "input_service='local'"),
        (
            "input_service_without_port",
            {"input_service": "grpc://dispatcher"},
            "input_service='grpc://dispatcher'",
        ),
        (
            "input_service_in_sync_mode",
            {"mode": "sync", "input_service": "chief"},
            "mode='sync'",
        ),
    )
    def test_bad_value_raises_config_error_naming_it(self, kwargs, named):
        with self.assertRaises(errors.ConfigError) as caught:
            tfdist.ParameterServerStrategy(_tf_config(PS_CLUSTER), **kwargs)
        self.assertIn(named, str(caught.exception))

    @parameterized.named_parameters(
        ("staleness_float", {"max_staleness": 1.5}),
        ("staleness_bool", {"max_staleness": True}),
        ("partitioner_not_callable", {"variable_partitioner": 256}),
        ("exactly_once_int", {"exactly_once": 1}),
        ("input_service_bool", {"input_service": True}),
    )
    def test_wrong_type_raises_type_error(self, kwargs):
        with self.assertRaises(TypeError):
            tfdist.ParameterServerStrategy(_tf_config(PS_CLUSTER), **kwargs)

    def test_cluster_and_cluster_resolver_both_given_raise(self):
        resolver = tfdist.cluster.to_cluster_resolver(
            tfdist.cluster.parse_tf_config(_tf_config(PS_CLUSTER))
        )
        with self.assertRaises(errors.ConfigError):
            tfdist.ParameterServerStrategy(
                _tf_config(PS_CLUSTER), cluster_resolver=resolver
            )


class BadClusterTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("no_ps", {"chief": 1, "worker": 2}, "cluster.ps"),
        ("no_chief", {"worker": 2, "ps": 1}, "cluster.chief"),
        ("no_worker", {"chief": 1, "ps": 1}, "cluster.worker"),
    )
    def test_cluster_missing_a_job_raises_naming_it(self, jobs, field):
        task = ("chief", 0) if jobs.get("chief") else ("worker", 0)
        with self.assertRaises(errors.ClusterConfigError) as caught:
            tfdist.ParameterServerStrategy(_tf_config(jobs, task))
        self.assertEqual(caught.exception.field, field)
        self.assertIn("tfdist.launch", str(caught.exception))

    def test_two_chiefs_raise(self):
        with self.assertRaises(errors.ClusterConfigError) as caught:
            tfdist.ParameterServerStrategy(
                _tf_config({"chief": 2, "worker": 1, "ps": 1})
            )
        self.assertIn("chief", str(caught.exception))

    def test_no_cluster_raises_with_the_ways_to_get_one(self):
        with self.assertRaises(errors.ClusterConfigError) as caught:
            tfdist.ParameterServerStrategy({})
        self.assertIn("start_local_ps_cluster", str(caught.exception))

    def test_evaluator_task_raises(self):
        config = _tf_config(PS_CLUSTER)
        config["cluster"]["evaluator"] = ["127.0.0.1:1"]
        config["task"] = {"type": "evaluator", "index": 0}
        with self.assertRaises(errors.ConfigError) as caught:
            tfdist.ParameterServerStrategy(config)
        self.assertIn("task='evaluator:0'", str(caught.exception))

    def test_bad_argument_wins_over_a_bad_cluster(self):
        # Arguments are checked first: no TF_CONFIG needed to see them.
        with self.assertRaises(errors.ConfigError) as caught:
            tfdist.ParameterServerStrategy({}, mode="hogwild")
        self.assertIn("mode='hogwild'", str(caught.exception))


class StartUpTest(absltest.TestCase):

    def listen(self, addresses: list[str]) -> None:
        """Accepts TCP connections at `addresses` (as started tasks would)."""
        for address in addresses:
            listener = socket.create_server(("127.0.0.1", int(address.rsplit(":", 1)[1])))
            self.addCleanup(listener.close)

    def test_missing_ps_raises_worker_unavailable_naming_it_within_timeout(self):
        config = _tf_config(PS_CLUSTER)
        self.listen(config["cluster"]["worker"])  # Workers "start"; ps:0 does not.
        started = time.monotonic()
        with self.assertRaises(errors.WorkerUnavailableError) as caught:
            tfdist.ParameterServerStrategy(json.dumps(config), timeout_s=TIMEOUT_S)
        self.assertLess(time.monotonic() - started, TIMEOUT_S + MARGIN_S)
        self.assertEqual(caught.exception.task, "ps:0")
        self.assertNotIn("worker:", str(caught.exception).split("did not accept")[0])

    def test_missing_worker_is_named_too(self):
        config = _tf_config(PS_CLUSTER)
        self.listen(config["cluster"]["ps"])
        with self.assertRaises(errors.WorkerUnavailableError) as caught:
            tfdist.ParameterServerStrategy(config, timeout_s=TIMEOUT_S)
        self.assertEqual(caught.exception.task, "worker:0")
        self.assertIn("worker:1", str(caught.exception))

    def test_chief_address_in_use_raises_cluster_config_error(self):
        config = _tf_config(PS_CLUSTER)
        self.listen(config["cluster"]["chief"])
        with self.assertRaises(errors.ClusterConfigError) as caught:
            tfdist.ParameterServerStrategy(config, timeout_s=TIMEOUT_S)
        self.assertEqual(caught.exception.field, "task.index")

    def test_a_hand_made_local_cluster_warns_once_that_it_is_not_isolated(self):
        # A TF_CONFIG of this host's addresses, written by hand (not by
        # tfdist.launch, which isolates local jobs): the servers would listen
        # on every interface of the host.
        config = _tf_config(PS_CLUSTER)
        self.listen(config["cluster"]["chief"])
        counts = []
        with mock.patch.object(isolation, "_reported", set()), mock.patch.dict(
                os.environ, {isolation.NOTICE_GIVEN_ENV: ""}), mock.patch.object(
                isolation, "network_is_private", return_value=False):
            for _ in range(2):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    with self.assertRaises(errors.ClusterConfigError):
                        tfdist.ParameterServerStrategy(config, timeout_s=TIMEOUT_S)
                notices = [w for w in caught if "not isolated" in str(w.message)]
                counts.append(len(notices))
                if notices:
                    self.assertRegex(str(notices[0].message), r"ParameterServerStrategy \(task chief:0\)")
                    self.assertEqual(notices[0].filename, __file__)  # Points at the caller.
        self.assertEqual(counts, [1, 0])

if __name__ == "__main__":
    tfdist.testing.main()
