"""Tests for tfdist.cluster.parse_tf_config (no TensorFlow needed)."""

from __future__ import annotations

import json
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from tfdist import errors
from tfdist.cluster import spec
from tfdist.cluster import tf_config

_VALID = {
    "cluster": {
        "chief": ["host0:2222"],
        "worker": ["host1:2222", "host2:2222"],
        "ps": ["[::1]:2222"],
    },
    "task": {"type": "worker", "index": 1},
}


def _with(cluster: object = None, task: object = None, **extra: object) -> str:
    """TF_CONFIG text: _VALID with `cluster`, `task` or keys replaced."""
    document: dict[str, object] = dict(_VALID)
    if cluster is not None:
        document["cluster"] = cluster
    if task is not None:
        document["task"] = task
    document.update(extra)
    return json.dumps(document)


class ParseValidTest(parameterized.TestCase):
    def test_parse_json_text_returns_config(self):
        config = tf_config.parse_tf_config(json.dumps(_VALID))
        self.assertEqual(
            config,
            spec.ClusterConfig(
                cluster=spec.ClusterSpec(_VALID["cluster"]),
                task=spec.TaskSpec("worker", 1),
                rpc_layer="grpc",
            ),
        )

    def test_parse_mapping_equals_parse_text(self):
        self.assertEqual(
            tf_config.parse_tf_config(_VALID),
            tf_config.parse_tf_config(json.dumps(_VALID)),
        )

    def test_parse_reads_rpc_layer(self):
        config = tf_config.parse_tf_config(_with(rpc_layer="grpc+verbs"))
        self.assertEqual(config.rpc_layer, "grpc+verbs")

    def test_parse_none_reads_environment(self):
        with mock.patch.dict(os.environ, {"TF_CONFIG": json.dumps(_VALID)}):
            config = tf_config.parse_tf_config()
        self.assertEqual(config.task, spec.TaskSpec("worker", 1))

    def test_parse_none_unset_environment_is_local(self):
        with mock.patch.dict(os.environ):
            os.environ.pop("TF_CONFIG", None)
            config = tf_config.parse_tf_config()
        self.assertEqual(config, spec.ClusterConfig.local())

    def test_parse_explicit_value_ignores_environment(self):
        with mock.patch.dict(os.environ, {"TF_CONFIG": "not json"}):
            config = tf_config.parse_tf_config(_VALID)
        self.assertEqual(config.task, spec.TaskSpec("worker", 1))

    @parameterized.named_parameters(
        ("empty_string", ""),
        ("whitespace", " \n\t"),
        ("empty_object", "{}"),
        ("empty_mapping", {}),
        ("only_unrelated_keys", '{"environment": "cloud"}'),
    )
    def test_parse_without_cluster_or_task_is_local(self, value):
        config = tf_config.parse_tf_config(value)
        self.assertEqual(config, spec.ClusterConfig.local())
        self.assertTrue(config.is_chief)

    def test_parse_empty_environment_is_local(self):
        with mock.patch.dict(os.environ, {"TF_CONFIG": ""}):
            self.assertTrue(tf_config.parse_tf_config().is_local)

    def test_parse_only_rpc_layer_is_local_with_rpc_layer(self):
        config = tf_config.parse_tf_config('{"rpc_layer": "grpc+verbs"}')
        self.assertEqual(config, spec.ClusterConfig.local("grpc+verbs"))

    def test_parse_ignores_orchestrator_keys(self):
        text = _with(
            task={"type": "worker", "index": 1, "trial": "3"},
            environment="cloud",
            job={"python_module": "trainer.task"},
        )
        self.assertEqual(
            tf_config.parse_tf_config(text),
            tf_config.parse_tf_config(_VALID),
        )

    def test_parse_accepts_tuple_addresses_in_mapping(self):
        config = tf_config.parse_tf_config(
            {
                "cluster": {"worker": ("a:1",)},
                "task": {"type": "worker", "index": 0},
            }
        )
        self.assertEqual(config.cluster, spec.ClusterSpec({"worker": ["a:1"]}))

    def test_to_json_round_trips(self):
        config = tf_config.parse_tf_config(_with(rpc_layer="grpc+verbs"))
        self.assertEqual(tf_config.parse_tf_config(config.to_json()), config)

    def test_to_dict_round_trips(self):
        config = tf_config.parse_tf_config(_VALID)
        self.assertEqual(tf_config.parse_tf_config(config.to_dict()), config)

    def test_local_to_json_round_trips(self):
        config = spec.ClusterConfig.local("grpc+verbs")
        self.assertEqual(tf_config.parse_tf_config(config.to_json()), config)


class ParseInvalidTest(parameterized.TestCase):
    """Each bad TF_CONFIG gives a ClusterConfigError naming field and fix."""

    @parameterized.named_parameters(
        (
            "index_out_of_range",
            '{"cluster": {"worker": ["a:1"]}, '
            '"task": {"type": "worker", "index": 3}}',
            "task.index",
            ["task.index=3", "0 <= index <= 0", "with 1 task(s)"],
        ),
        (
            "index_negative",
            _with(task={"type": "worker", "index": -1}),
            "task.index",
            ["task.index=-1", ">= 0", "Set task.index"],
        ),
        (
            "index_bool",
            _with(task={"type": "worker", "index": True}),
            "task.index",
            ["task.index=True", "JSON boolean", "without quotes"],
        ),
        (
            "index_str",
            _with(task={"type": "worker", "index": "1"}),
            "task.index",
            ["task.index='1'", "JSON string", "without quotes"],
        ),
        (
            "index_float",
            _with(task={"type": "worker", "index": 1.0}),
            "task.index",
            ["task.index=1.0", "non-integer", "decimals"],
        ),
        (
            "index_null",
            _with(task={"type": "worker", "index": None}),
            "task.index",
            ["task.index=None", "JSON null"],
        ),
        (
            "index_huge",
            _with(task={"type": "worker", "index": 10**30}),
            "task.index",
            [f"task.index={10**30}", "0 <= index <= 1"],
        ),
        (
            "index_missing",
            _with(task={"type": "worker"}),
            "task.index",
            ["has no 'index'", "Add task.index"],
        ),
        (
            "type_missing",
            _with(task={"index": 0}),
            "task.type",
            ["has no 'type'", "Add task.type"],
        ),
        (
            "type_unknown",
            _with(task={"type": "master", "index": 0}),
            "task.type",
            ["task.type='master'", "'chief', 'worker', 'ps', 'evaluator'"],
        ),
        (
            "type_not_str",
            _with(task={"type": 1, "index": 0}),
            "task.type",
            ["task.type=1", "Quote the task type"],
        ),
        (
            "type_absent_from_cluster",
            _with(task={"type": "evaluator", "index": 0}),
            "task.type",
            ["task.type='evaluator'", "Add job 'evaluator'"],
        ),
        (
            "task_not_object",
            _with(task=["worker", 0]),
            "task",
            ["task=['worker', 0]", "JSON array", "JSON object"],
        ),
        (
            "task_missing",
            '{"cluster": {"worker": ["a:1"]}}',
            "task",
            ["but no task", "Add the task"],
        ),
        (
            "cluster_missing",
            '{"task": {"type": "worker", "index": 0}}',
            "cluster",
            ["but no cluster", "Add the cluster"],
        ),
        (
            "cluster_empty",
            '{"cluster": {}, "task": {"type": "worker", "index": 0}}',
            "cluster",
            ["cluster={}", "unset TF_CONFIG"],
        ),
        (
            "cluster_not_object",
            _with(cluster=["a:1"]),
            "cluster",
            ["cluster=['a:1']", "JSON array", "JSON object"],
        ),
        (
            "cluster_null",
            '{"cluster": null, "task": {"type": "worker", "index": 0}}',
            "cluster",
            ["cluster=None", "JSON null"],
        ),
        (
            "unknown_job",
            _with(cluster={"master": ["m:1"], "worker": ["a:1", "b:1"]}),
            "cluster.master",
            ["'master'", "Rename or remove"],
        ),
        (
            "job_not_list",
            _with(cluster={"worker": "a:1"}),
            "cluster.worker",
            ["cluster.worker='a:1'", "JSON list"],
        ),
        (
            "job_dict",
            _with(cluster={"worker": {"0": "a:1"}}),
            "cluster.worker",
            ["cluster.worker={'0': 'a:1'}", "JSON list"],
        ),
        (
            "address_not_str",
            _with(cluster={"worker": ["a:1", 2222]}),
            "cluster.worker[1]",
            ["cluster.worker[1]=2222", "Quote the address"],
        ),
        (
            "address_nested_list",
            _with(cluster={"worker": [["a:1"]]}),
            "cluster.worker[0]",
            ["cluster.worker[0]=['a:1']", "Quote the address"],
        ),
        (
            "duplicate_address",
            _with(cluster={"chief": ["a:1"], "worker": ["a:1", "b:1"]}),
            "cluster.worker[0]",
            ["cluster.worker[0]='a:1'", "cluster.chief[0]", "distinct"],
        ),
        (
            "port_zero",
            _with(cluster={"worker": ["a:1", "b:0"]}),
            "cluster.worker[1]",
            ["cluster.worker[1]='b:0'", "out of range", "2222"],
        ),
        (
            "port_too_big",
            _with(cluster={"worker": ["a:1", "b:65536"]}),
            "cluster.worker[1]",
            ["'b:65536'", "out of range"],
        ),
        (
            "port_not_numeric",
            _with(cluster={"worker": ["a:1", "b:grpc"]}),
            "cluster.worker[1]",
            ["'b:grpc'", "not a number"],
        ),
        (
            "port_missing",
            _with(cluster={"worker": ["a:1", "b"]}),
            "cluster.worker[1]",
            ["'b'", "has no port"],
        ),
        (
            "host_empty",
            _with(cluster={"worker": ["a:1", ":2"]}),
            "cluster.worker[1]",
            ["':2'", "empty host"],
        ),
        (
            "two_chiefs",
            _with(cluster={"chief": ["c:1", "c:2"], "worker": ["a:1", "b:1"]}),
            "cluster.chief",
            ["at most one chief", "cluster.worker"],
        ),
        (
            "two_evaluators",
            _with(
                cluster={"evaluator": ["e:1", "e:2"], "worker": ["a:1", "b:1"]}
            ),
            "cluster.evaluator",
            ["at most one evaluator"],
        ),
        (
            "empty_job",
            _with(cluster={"ps": [], "worker": ["a:1", "b:1"]}),
            "cluster.ps",
            ["cluster.ps=[]", "remove job 'ps'"],
        ),
        (
            "rpc_layer_not_str",
            _with(rpc_layer=5),
            "rpc_layer",
            ["rpc_layer=5", "omit rpc_layer"],
        ),
        (
            "rpc_layer_empty",
            _with(rpc_layer=""),
            "rpc_layer",
            ["rpc_layer=''", "Omit rpc_layer"],
        ),
        (
            "key_case_typo",
            '{"Cluster": {"worker": ["a:1"]}}',
            "cluster",
            ["'Cluster'", "Rename the key to 'cluster'"],
        ),
        (
            "key_spelling_typo",
            _with(rpclayer="grpc"),
            "rpc_layer",
            ["'rpclayer'", "Rename the key to 'rpc_layer'"],
        ),
        (
            "task_key_typo",
            _with(task={"type": "worker", "indx": 0}),
            "task.index",
            ["'indx'", "Rename the key to 'index'"],
        ),
    )
    def test_parse_raises_cluster_config_error_bad_field(
        self, text, field, fragments
    ):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            tf_config.parse_tf_config(text)
        self.assertEqual(raised.exception.field, field)
        for fragment in fragments:
            self.assertIn(fragment, str(raised.exception))

    @parameterized.named_parameters(
        ("truncated", '{"cluster": ', "not valid JSON", "Expecting value"),
        ("single_quotes", "{'cluster': {}}", "not valid JSON", "Expected e.g."),
        ("trailing_comma", '{"task": {},}', "not valid JSON", "Expected e.g."),
        ("nan", '{"x": NaN}', "NaN", "not standard JSON"),
        ("infinity", '{"x": -Infinity}', "-Infinity", "not standard JSON"),
        ("repeated_key", '{"task": {}, "task": {}}', "'task'", "Remove the"),
        ("deep_nesting", "[" * 100_000, "too deeply", "Expected a shallow"),
        ("huge_int", "1" * 5000, "cannot decode", "Expected e.g."),
        (
            "too_long",
            " " * (tf_config.MAX_TF_CONFIG_CHARS + 1) + "{}",
            "characters long",
            f"at most {tf_config.MAX_TF_CONFIG_CHARS}",
        ),
        ("array", "[]", "must be a JSON object", "JSON array"),
        ("string", '"worker"', "must be a JSON object", "JSON string"),
        ("number", "3", "must be a JSON object", "JSON integer"),
        ("null", "null", "must be a JSON object", "JSON null"),
    )
    def test_parse_raises_cluster_config_error_bad_document(
        self, text, first, second
    ):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            tf_config.parse_tf_config(text)
        self.assertIsNone(raised.exception.field)
        self.assertIn(first, str(raised.exception))
        self.assertIn(second, str(raised.exception))
        self.assertLess(len(str(raised.exception)), 1000)

    def test_parse_invalid_environment_names_tf_config(self):
        with mock.patch.dict(os.environ, {"TF_CONFIG": "{bad"}):
            with self.assertRaisesRegex(
                errors.ClusterConfigError, "TF_CONFIG is not valid JSON"
            ):
                tf_config.parse_tf_config()

    def test_parse_mapping_non_str_key_raises(self):
        with self.assertRaisesRegex(errors.ClusterConfigError, "key 1 of type"):
            tf_config.parse_tf_config({1: "x"})  # type: ignore[dict-item]

    def test_parse_mapping_non_str_job_name_raises(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            tf_config.parse_tf_config(
                {
                    "cluster": {0: ["a:1"]},
                    "task": {"type": "worker", "index": 0},
                }
            )
        self.assertEqual(raised.exception.field, "cluster")

    def test_parse_mapping_enormous_index_describes_it(self):
        document = {
            "cluster": {"worker": ["a:1"]},
            "task": {"type": "worker", "index": 10**5000},
        }
        with self.assertRaisesRegex(
            errors.ClusterConfigError, r"task.index=<int of about 500\d digits>"
        ):
            tf_config.parse_tf_config(document)

    def test_parse_mapping_non_json_value_raises(self):
        document = {
            "cluster": {"worker": [object()]},
            "task": {"type": "worker", "index": 0},
        }
        with self.assertRaisesRegex(
            errors.ClusterConfigError, "Python type object"
        ):
            tf_config.parse_tf_config(document)

    @parameterized.named_parameters(
        ("bytes", b"{}"),
        ("int", 0),
        ("list", []),
    )
    def test_parse_raises_type_error_wrong_argument_type(self, value):
        with self.assertRaisesRegex(TypeError, "str, a mapping or None"):
            tf_config.parse_tf_config(value)


if __name__ == "__main__":
    absltest.main()
