"""Tests for tfdist.cluster.to_cluster_resolver against TensorFlow's own rules.

The resolver must answer what `TFConfigClusterResolver` answers for the same
TF_CONFIG, and `ClusterConfig`'s chief/worker helpers must agree with TF's
`multi_worker_util`, the functions TF's multi-worker strategies use. No test
starts a server.
"""

from __future__ import annotations

import os
from unittest import mock

import tensorflow as tf
from absl.testing import absltest
from absl.testing import parameterized

# Test-only oracle: TF's own chief/worker-count rules. Library code keeps TF
# internals in tfdist/_internal/; tests may compare against them.
from tensorflow.python.distribute import multi_worker_util

import tfdist
from tfdist import cluster
from tfdist.cluster import resolver as resolver_lib

_PS_JOBS = {
    "chief": ["c0:2222"],
    "worker": ["w0:2222", "w1:2222"],
    "ps": ["p0:2222"],
}
_EVAL_JOBS = {"worker": ["w0:2222", "w1:2222"], "evaluator": ["e0:2222"]}

# (name, TF_CONFIG): every case the resolver must translate like TF does.
_CASES = (
    ("local", "{}"),
    ("local_rpc_layer", '{"rpc_layer": "grpc+verbs"}'),
    (
        "single_worker",
        '{"cluster": {"worker": ["localhost:2222"]}, '
        '"task": {"type": "worker", "index": 0}}',
    ),
    (
        "worker1_no_chief",
        '{"cluster": {"worker": ["w0:2222", "w1:2222"]}, '
        '"task": {"type": "worker", "index": 1}}',
    ),
    (
        "ps_cluster_chief",
        cluster.ClusterConfig(
            cluster=cluster.ClusterSpec(_PS_JOBS),
            task=cluster.TaskSpec("chief", 0),
        ).to_json(),
    ),
    (
        "ps_cluster_worker1",
        cluster.ClusterConfig(
            cluster=cluster.ClusterSpec(_PS_JOBS),
            task=cluster.TaskSpec("worker", 1),
        ).to_json(),
    ),
    (
        "ps_cluster_ps",
        cluster.ClusterConfig(
            cluster=cluster.ClusterSpec(_PS_JOBS),
            task=cluster.TaskSpec("ps", 0),
            rpc_layer="grpc+verbs",
        ).to_json(),
    ),
    (
        "evaluator",
        cluster.ClusterConfig(
            cluster=cluster.ClusterSpec(_EVAL_JOBS),
            task=cluster.TaskSpec("evaluator", 0),
        ).to_json(),
    ),
    (
        "ipv6",
        '{"cluster": {"worker": ["[::1]:2222", "[::1]:2223"]}, '
        '"task": {"type": "worker", "index": 1}}',
    ),
)

# Cluster tasks only: TF's multi_worker_util needs a task type. Every one of
# these clusters has a worker job.
_TASK_CASES = tuple(case for case in _CASES if not case[0].startswith("local"))
# Chief and worker tasks: those TF's id_in_cluster numbers as trainers.
_TRAINER_CASES = tuple(
    case
    for case in _TASK_CASES
    if case[0] not in ("ps_cluster_ps", "evaluator")
)


def _answers(
    resolver: tf.distribute.cluster_resolver.ClusterResolver,
) -> tuple[object, ...]:
    """What strategies ask a resolver: cluster, task, protocol, master."""
    return (
        resolver.cluster_spec().as_dict(),
        resolver.task_type,
        resolver.task_id,
        resolver.rpc_layer,
        resolver.master(),
    )


def _tf_answers(text: str) -> tuple[object, ...]:
    """`_answers` of TF's own TFConfigClusterResolver for TF_CONFIG `text`.

    TF reports `rpc_layer=None` when TF_CONFIG names none, and its strategies
    then use "grpc"; tfdist makes that default explicit, so the oracle does
    too.
    """
    with mock.patch.dict(os.environ, {"TF_CONFIG": text}):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        resolver.rpc_layer = resolver.rpc_layer or "grpc"
        return _answers(resolver)


class ToClusterResolverTest(parameterized.TestCase):
    def test_returns_simple_cluster_resolver(self):
        resolver = cluster.to_cluster_resolver(cluster.ClusterConfig.local())
        self.assertIsInstance(
            resolver, tf.distribute.cluster_resolver.SimpleClusterResolver
        )

    def test_worker_resolver_has_config_fields(self):
        config = cluster.parse_tf_config(_CASES[3][1])
        resolver = cluster.to_cluster_resolver(config)
        self.assertEqual(
            (
                resolver.cluster_spec().as_dict(),
                resolver.task_type,
                resolver.task_id,
                resolver.rpc_layer,
                resolver.master(),
            ),
            (
                {"worker": ["w0:2222", "w1:2222"]},
                "worker",
                1,
                "grpc",
                "grpc://w1:2222",
            ),
        )

    def test_local_resolver_has_empty_cluster(self):
        resolver = cluster.to_cluster_resolver(cluster.ClusterConfig.local())
        self.assertEqual(
            (
                resolver.cluster_spec().as_dict(),
                resolver.task_type,
                resolver.task_id,
                resolver.master(),
            ),
            ({}, None, None, ""),
        )

    @parameterized.named_parameters(*_CASES)
    def test_matches_tf_config_cluster_resolver(self, text):
        resolver = cluster.to_cluster_resolver(cluster.parse_tf_config(text))
        self.assertEqual(_answers(resolver), _tf_answers(text))

    @parameterized.named_parameters(*_TASK_CASES)
    def test_is_chief_matches_tf_multi_worker_util(self, text):
        config = cluster.parse_tf_config(text)
        resolver = cluster.to_cluster_resolver(config)
        self.assertEqual(
            config.is_chief,
            multi_worker_util.is_chief(
                resolver.cluster_spec(), resolver.task_type, resolver.task_id
            ),
        )

    @parameterized.named_parameters(*_TASK_CASES)
    def test_num_workers_matches_tf_worker_count(self, text):
        config = cluster.parse_tf_config(text)
        self.assertEqual(
            config.num_workers,
            multi_worker_util.worker_count(
                cluster.to_cluster_resolver(config).cluster_spec(), "worker"
            ),
        )

    @parameterized.named_parameters(*_TRAINER_CASES)
    def test_worker_index_matches_tf_id_in_cluster(self, text):
        config = cluster.parse_tf_config(text)
        resolver = cluster.to_cluster_resolver(config)
        self.assertEqual(
            config.worker_index,
            multi_worker_util.id_in_cluster(
                resolver.cluster_spec(), resolver.task_type, resolver.task_id
            ),
        )

    def test_multi_worker_mirrored_strategy_accepts_local_resolver(self):
        resolver = cluster.to_cluster_resolver(cluster.ClusterConfig.local())
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver
        )
        self.assertIs(strategy.cluster_resolver, resolver)
        self.assertEqual(strategy.num_replicas_in_sync, 1)

    def test_raises_type_error_non_config(self):
        with self.assertRaisesRegex(TypeError, "ClusterConfig"):
            cluster.to_cluster_resolver({"cluster": {}})  # type: ignore[arg-type]


class FromClusterResolverTest(parameterized.TestCase):
    """TF's `cluster_resolver=` argument, read back into a ClusterConfig."""

    @parameterized.named_parameters(*_CASES)
    def test_round_trip_through_tf_resolver_gives_the_same_config(self, text):
        config = cluster.parse_tf_config(text)
        self.assertEqual(
            resolver_lib.from_cluster_resolver(cluster.to_cluster_resolver(config)),
            config,
        )

    def test_simple_cluster_resolver_becomes_the_equivalent_config(self):
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(_PS_JOBS), task_type="worker", task_id=1,
            rpc_layer="grpc",
        )
        config = resolver_lib.from_cluster_resolver(resolver)
        self.assertEqual(config.task, cluster.TaskSpec("worker", 1))
        self.assertEqual(config.cluster.to_dict(), _PS_JOBS)

    def test_task_outside_the_resolvers_cluster_is_a_cluster_config_error(self):
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": ["w0:1"]}), task_type="worker", task_id=3
        )
        with self.assertRaisesRegex(tfdist.errors.ClusterConfigError, "index=3"):
            resolver_lib.from_cluster_resolver(resolver)

    def test_cluster_and_cluster_resolver_together_are_refused(self):
        resolver = cluster.to_cluster_resolver(cluster.ClusterConfig.local())
        with self.assertRaisesRegex(tfdist.errors.ConfigError, "cluster_resolver="):
            resolver_lib.resolve_cluster("{}", resolver)

    def test_resolver_as_first_argument_is_accepted_as_tf_does(self):
        config = cluster.parse_tf_config(_CASES[3][1])
        self.assertEqual(
            resolver_lib.resolve_cluster(cluster.to_cluster_resolver(config)), config
        )

    def test_non_resolver_is_a_type_error(self):
        with self.assertRaisesRegex(TypeError, "ClusterResolver"):
            resolver_lib.from_cluster_resolver("grpc://w0:1")  # type: ignore[arg-type]


if __name__ == "__main__":
    tfdist.testing.main()
