"""Tests for tfdist.cluster.spec: Address, TaskSpec, ClusterSpec, ClusterConfig.

These need no TensorFlow; `ImportWithoutTensorFlowTest` proves that
`spec.py` and `tf_config.py` import and run with TensorFlow unimportable.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import pickle
import subprocess
import sys
import textwrap

from absl.testing import absltest
from absl.testing import parameterized

from tfdist import errors
from tfdist.cluster import spec

_PS_CLUSTER = {
    "chief": ["c0:2222"],
    "worker": ["w0:2222", "w1:2222"],
    "ps": ["p0:2222", "p1:2222"],
    "evaluator": ["e0:2222"],
}
_WORKER_CLUSTER = {"worker": ["w0:2222", "w1:2222", "w2:2222"]}


def _config(
    jobs: dict[str, list[str]], task_type: spec.TaskType, task_id: int
) -> spec.ClusterConfig:
    return spec.ClusterConfig(
        cluster=spec.ClusterSpec(jobs), task=spec.TaskSpec(task_type, task_id)
    )


class AddressTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("ipv4", "10.0.0.1:2222", "10.0.0.1", 2222),
        ("hostname", "worker-0.tfjob.svc:2222", "worker-0.tfjob.svc", 2222),
        ("localhost_min_port", "localhost:1", "localhost", 1),
        ("max_port", "h_1:65535", "h_1", 65535),
        ("leading_zero_port", "h:02222", "h", 2222),
        ("ipv6_loopback", "[::1]:2222", "::1", 2222),
        (
            "ipv6_full",
            "[2001:db8::8a2e:370:7334]:80",
            "2001:db8::8a2e:370:7334",
            80,
        ),
        ("ipv6_zone", "[fe80::1%eth0]:2222", "fe80::1%eth0", 2222),
    )
    def test_parse_splits_host_and_port_valid_address(self, text, host, port):
        self.assertEqual(spec.Address.parse(text), spec.Address(host, port))

    @parameterized.named_parameters(
        ("ipv4", "10.0.0.1:2222"),
        ("hostname", "localhost:2222"),
        ("ipv6", "[::1]:2222"),
    )
    def test_str_round_trips_canonical_address(self, text):
        self.assertEqual(str(spec.Address.parse(text)), text)

    @parameterized.named_parameters(
        ("no_port", "localhost", "has no port", "Append ':<port>'"),
        ("empty_port", "localhost:", "has no port after", "Append the port"),
        ("port_zero", "localhost:0", "out of range", "such as 2222"),
        ("port_too_big", "localhost:65536", "out of range", "such as 2222"),
        ("port_many_digits", "h:" + "9" * 5000, "out of range", "such as 2222"),
        ("port_not_number", "localhost:http", "not a number", "decimal"),
        ("port_negative", "localhost:-1", "not a number", "decimal"),
        ("port_unicode_digit", "localhost:\u0662", "not a number", "decimal"),
        ("empty_host", ":2222", "empty host", "host name first"),
        ("empty_ipv6_host", "[]:2222", "empty host", "host name first"),
        ("space_in_host", "my host:2222", "not a host name", "Remove spaces"),
        ("unicode_host", "h\u00f6st:2222", "not a host name", "Remove spaces"),
        ("bare_ipv6", "::1:2222", "more than one ':'", "in brackets"),
        ("bad_ipv6", "[::g]:2222", "not a valid IPv6", "Correct the IPv6"),
        (
            "ipv4_in_brackets",
            "[10.0.0.1]:2222",
            "in brackets, which is not IPv6",
            "Drop the brackets",
        ),
        ("unclosed_bracket", "[::1:2222", "unclosed '['", "Close it"),
        ("no_port_after_bracket", "[::1]", "no ':port' after", "'[::1]:2222'"),
        ("scheme", "grpc://localhost:2222", "URL scheme", "rpc_layer"),
        ("empty", "", "has no port", "Append ':<port>'"),
    )
    def test_parse_raises_cluster_config_error_bad_address(
        self, text, problem, fix
    ):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.Address.parse(text)
        message = str(raised.exception)
        self.assertIsNone(raised.exception.field)
        self.assertIn(problem, message)
        self.assertIn(fix, message)
        self.assertIn("1 <= port <= 65535", message)
        self.assertLess(len(message), 500)

    def test_parse_names_received_value_bad_address(self):
        with self.assertRaisesRegex(
            errors.ClusterConfigError, r"address='localhost:0'"
        ):
            spec.Address.parse("localhost:0")

    def test_parse_raises_type_error_non_str(self):
        with self.assertRaisesRegex(TypeError, "address must be a str"):
            spec.Address.parse(2222)  # type: ignore[arg-type]

    @parameterized.named_parameters(
        ("port_zero", "h", 0),
        ("port_too_big", "h", 70000),
        ("empty_host", "", 2222),
        ("bracketed_host", "[::1]", 2222),
    )
    def test_constructor_raises_cluster_config_error_bad_field(
        self, host, port
    ):
        with self.assertRaises(errors.ClusterConfigError):
            spec.Address(host, port)

    @parameterized.named_parameters(
        ("host_int", 1, 2222),
        ("port_str", "h", "2222"),
        ("port_bool", "h", True),
    )
    def test_constructor_raises_type_error_wrong_type(self, host, port):
        with self.assertRaises(TypeError):
            spec.Address(host, port)


class TaskSpecTest(parameterized.TestCase):
    def test_name_joins_type_and_id(self):
        self.assertEqual(spec.TaskSpec("worker", 1).name, "worker:1")

    def test_setattr_raises_frozen_instance(self):
        task = spec.TaskSpec("ps", 0)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            task.task_id = 1  # type: ignore[misc]

    def test_constructor_raises_unknown_task_type(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.TaskSpec("master", 0)  # type: ignore[arg-type]
        self.assertEqual(raised.exception.field, "task.type")
        self.assertIn("task.type='master'", str(raised.exception))
        self.assertIn("'evaluator'", str(raised.exception))

    def test_constructor_raises_negative_task_id(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.TaskSpec("worker", -1)
        self.assertEqual(raised.exception.field, "task.index")
        self.assertIn("task.index=-1", str(raised.exception))
        self.assertIn(">= 0", str(raised.exception))

    @parameterized.named_parameters(
        ("bool_id", "worker", True),
        ("str_id", "worker", "0"),
        ("float_id", "worker", 0.0),
        ("int_type", 0, 0),
    )
    def test_constructor_raises_type_error_wrong_type(self, task_type, task_id):
        with self.assertRaises(TypeError):
            spec.TaskSpec(task_type, task_id)


class ClusterSpecTest(parameterized.TestCase):
    def test_job_names_in_canonical_order_any_input_order(self):
        cluster = spec.ClusterSpec(
            {"ps": ["p:1"], "worker": ["w:1"], "chief": ["c:1"]}
        )
        self.assertEqual(cluster.job_names, ("chief", "worker", "ps"))

    def test_addresses_returns_tuple_of_given_strings(self):
        cluster = spec.ClusterSpec(_PS_CLUSTER)
        self.assertEqual(cluster.addresses("ps"), ("p0:2222", "p1:2222"))

    def test_addresses_returns_empty_absent_job(self):
        self.assertEqual(spec.ClusterSpec(_WORKER_CLUSTER).addresses("ps"), ())

    def test_addresses_raises_unknown_job(self):
        with self.assertRaisesRegex(
            errors.ClusterConfigError, "task_type='master'"
        ):
            spec.ClusterSpec(_WORKER_CLUSTER).addresses("master")

    def test_address_returns_task_address(self):
        cluster = spec.ClusterSpec(_PS_CLUSTER)
        self.assertEqual(cluster.address(spec.TaskSpec("worker", 1)), "w1:2222")

    def test_address_raises_task_out_of_range(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.ClusterSpec(_WORKER_CLUSTER).address(
                spec.TaskSpec("worker", 3)
            )
        self.assertEqual(raised.exception.field, "task.index")

    def test_tasks_enumerates_jobs_in_order(self):
        names = [t.name for t in spec.ClusterSpec(_PS_CLUSTER).tasks()]
        self.assertEqual(
            names,
            [
                "chief:0",
                "worker:0",
                "worker:1",
                "ps:0",
                "ps:1",
                "evaluator:0",
            ],
        )

    @parameterized.named_parameters(
        ("workers_only", _WORKER_CLUSTER, 3, 0, 3),
        ("chief_workers_ps_evaluator", _PS_CLUSTER, 3, 2, 6),
        ("evaluator_only", {"evaluator": ["e:1"]}, 0, 0, 1),
        ("chief_only", {"chief": ["c:1"]}, 1, 0, 1),
    )
    def test_counts_match_tf_rules(self, jobs, num_workers, num_ps, num_tasks):
        cluster = spec.ClusterSpec(jobs)
        self.assertEqual(
            (cluster.num_workers, cluster.num_ps, cluster.num_tasks),
            (num_workers, num_ps, num_tasks),
        )

    @parameterized.named_parameters(
        ("chief_job", _PS_CLUSTER, spec.TaskSpec("chief", 0)),
        ("no_chief_job", _WORKER_CLUSTER, spec.TaskSpec("worker", 0)),
        ("evaluator_only", {"evaluator": ["e:1"]}, None),
    )
    def test_chief_task_follows_tf_rule(self, jobs, chief_task):
        self.assertEqual(spec.ClusterSpec(jobs).chief_task, chief_task)

    def test_to_dict_returns_lists_in_canonical_order(self):
        cluster = spec.ClusterSpec({"worker": ("w:1",), "chief": ("c:1",)})
        self.assertEqual(
            list(cluster.to_dict().items()),
            [("chief", ["c:1"]), ("worker", ["w:1"])],
        )

    def test_equal_and_same_hash_different_input_order(self):
        first = spec.ClusterSpec({"worker": ["w:1"], "ps": ["p:1"]})
        second = spec.ClusterSpec({"ps": ("p:1",), "worker": ("w:1",)})
        self.assertEqual(first, second)
        self.assertEqual(hash(first), hash(second))

    def test_jobs_unaffected_by_later_input_mutation(self):
        jobs = {"worker": ["w:1"]}
        cluster = spec.ClusterSpec(jobs)
        jobs["worker"].append("w:2")
        jobs["ps"] = ["p:1"]
        self.assertEqual(cluster.to_dict(), {"worker": ["w:1"]})

    def test_jobs_item_assignment_raises_type_error(self):
        cluster = spec.ClusterSpec(_WORKER_CLUSTER)
        with self.assertRaises(TypeError):
            cluster.jobs["ps"] = ("p:1",)  # type: ignore[index]

    def test_setattr_raises_frozen_instance(self):
        cluster = spec.ClusterSpec(_WORKER_CLUSTER)
        with self.assertRaises(dataclasses.FrozenInstanceError):
            cluster.jobs = {}  # type: ignore[misc]

    def test_pickle_round_trips(self):
        cluster = spec.ClusterSpec(_PS_CLUSTER)
        self.assertEqual(pickle.loads(pickle.dumps(cluster)), cluster)

    def test_deepcopy_and_asdict_work(self):
        cluster = spec.ClusterSpec(_PS_CLUSTER)
        self.assertEqual(copy.deepcopy(cluster), cluster)
        self.assertEqual(
            dict(dataclasses.asdict(cluster)["jobs"]), cluster.jobs
        )

    def test_repr_shows_jobs(self):
        self.assertEqual(
            repr(spec.ClusterSpec({"worker": ["w:1"]})),
            "ClusterSpec(jobs={'worker': ('w:1',)})",
        )

    @parameterized.named_parameters(
        ("empty", {}, "cluster", ["cluster={}", "unset TF_CONFIG"]),
        (
            "unknown_job",
            {"master": ["m:1"]},
            "cluster.master",
            ["'master'", "Rename or remove"],
        ),
        (
            "empty_job",
            {"worker": []},
            "cluster.worker",
            ["cluster.worker=[]", "remove job 'worker'"],
        ),
        (
            "two_chiefs",
            {"chief": ["c:1", "c:2"]},
            "cluster.chief",
            ["['c:1', 'c:2']", "at most one chief", "cluster.worker"],
        ),
        (
            "two_evaluators",
            {"worker": ["w:1"], "evaluator": ["e:1", "e:2"]},
            "cluster.evaluator",
            ["['e:1', 'e:2']", "at most one evaluator"],
        ),
        (
            "duplicate_in_job",
            {"worker": ["w:1", "w:1"]},
            "cluster.worker[1]",
            ["cluster.worker[1]='w:1'", "cluster.worker[0]", "distinct port"],
        ),
        (
            "duplicate_across_jobs",
            {"chief": ["h:1"], "ps": ["h:1"]},
            "cluster.ps[0]",
            ["cluster.ps[0]='h:1'", "cluster.chief[0]", "distinct port"],
        ),
        (
            "duplicate_host_case",
            {"worker": ["Host:1", "host:1"]},
            "cluster.worker[1]",
            ["'host:1'", "distinct port"],
        ),
        (
            "duplicate_ipv6_spelling",
            {"worker": ["[::1]:1", "[0:0::1]:1"]},
            "cluster.worker[1]",
            ["'[0:0::1]:1'", "distinct port"],
        ),
        (
            "bad_port",
            {"worker": ["w:1", "w:0"]},
            "cluster.worker[1]",
            ["cluster.worker[1]='w:0'", "out of range", "such as 2222"],
        ),
        (
            "missing_port",
            {"ps": ["p"]},
            "cluster.ps[0]",
            ["cluster.ps[0]='p'", "no port", "Append"],
        ),
        (
            "empty_host",
            {"evaluator": [":1"]},
            "cluster.evaluator[0]",
            ["cluster.evaluator[0]=':1'", "empty host"],
        ),
    )
    def test_constructor_raises_cluster_config_error_bad_jobs(
        self, jobs, field, fragments
    ):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.ClusterSpec(jobs)
        self.assertEqual(raised.exception.field, field)
        for fragment in fragments:
            self.assertIn(fragment, str(raised.exception))

    @parameterized.named_parameters(
        ("not_mapping", [("worker", ["w:1"])]),
        ("int_job_name", {0: ["w:1"]}),
        ("str_job", {"worker": "w:1"}),
        ("bytes_job", {"worker": b"w:1"}),
        ("int_address", {"worker": ["w:1", 2222]}),
        ("set_job", {"worker": {"w:1"}}),
    )
    def test_constructor_raises_type_error_wrong_type(self, jobs):
        with self.assertRaises(TypeError):
            spec.ClusterSpec(jobs)


class ClusterConfigTest(parameterized.TestCase):
    def test_local_has_no_cluster_and_is_chief(self):
        config = spec.ClusterConfig.local()
        self.assertEqual(
            (
                config.cluster,
                config.task,
                config.rpc_layer,
                config.is_local,
                config.is_chief,
                config.worker_index,
                config.num_workers,
                config.address,
            ),
            (None, None, "grpc", True, True, 0, 1, None),
        )

    def test_local_equals_default_constructor(self):
        self.assertEqual(spec.ClusterConfig.local(), spec.ClusterConfig())

    @parameterized.named_parameters(
        ("chief", _PS_CLUSTER, "chief", 0, True),
        ("worker0_with_chief", _PS_CLUSTER, "worker", 0, False),
        ("worker0_without_chief", _WORKER_CLUSTER, "worker", 0, True),
        ("worker1_without_chief", _WORKER_CLUSTER, "worker", 1, False),
        ("ps", _PS_CLUSTER, "ps", 0, False),
        ("evaluator", _PS_CLUSTER, "evaluator", 0, True),
    )
    def test_is_chief_follows_tf_rule(self, jobs, task_type, task_id, is_chief):
        self.assertEqual(_config(jobs, task_type, task_id).is_chief, is_chief)

    @parameterized.named_parameters(
        ("chief", _PS_CLUSTER, "chief", 0, 0),
        ("worker1_with_chief", _PS_CLUSTER, "worker", 1, 2),
        ("worker1_without_chief", _WORKER_CLUSTER, "worker", 1, 1),
        ("ps", _PS_CLUSTER, "ps", 1, None),
        ("evaluator", _PS_CLUSTER, "evaluator", 0, None),
    )
    def test_worker_index_counts_chief_first(
        self, jobs, task_type, task_id, worker_index
    ):
        config = _config(jobs, task_type, task_id)
        self.assertEqual(config.worker_index, worker_index)

    def test_address_returns_own_address(self):
        self.assertEqual(_config(_PS_CLUSTER, "ps", 1).address, "p1:2222")

    def test_num_workers_counts_chief_and_workers(self):
        self.assertEqual(_config(_PS_CLUSTER, "ps", 0).num_workers, 3)

    def test_to_dict_has_tf_config_structure(self):
        config = spec.ClusterConfig(
            cluster=spec.ClusterSpec({"worker": ["w:1", "w:2"]}),
            task=spec.TaskSpec("worker", 1),
            rpc_layer="grpc+verbs",
        )
        self.assertEqual(
            config.to_dict(),
            {
                "cluster": {"worker": ["w:1", "w:2"]},
                "task": {"type": "worker", "index": 1},
                "rpc_layer": "grpc+verbs",
            },
        )

    def test_to_dict_local_has_only_rpc_layer(self):
        self.assertEqual(
            spec.ClusterConfig.local().to_dict(), {"rpc_layer": "grpc"}
        )

    def test_to_json_is_json_of_to_dict(self):
        config = _config(_PS_CLUSTER, "worker", 1)
        self.assertEqual(json.loads(config.to_json()), config.to_dict())

    def test_to_json_indent_writes_lines(self):
        config = _config(_WORKER_CLUSTER, "worker", 1)
        self.assertIn("\n", config.to_json(indent=2))

    def test_pickle_round_trips(self):
        config = _config(_PS_CLUSTER, "ps", 1)
        self.assertEqual(pickle.loads(pickle.dumps(config)), config)

    def test_hash_equal_for_equal_configs(self):
        self.assertEqual(
            hash(_config(_PS_CLUSTER, "ps", 1)),
            hash(_config(dict(reversed(_PS_CLUSTER.items())), "ps", 1)),
        )

    def test_constructor_raises_index_out_of_range(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            _config({"worker": ["a:1"]}, "worker", 3)
        self.assertEqual(raised.exception.field, "task.index")
        self.assertEqual(
            str(raised.exception),
            "task.index=3 is out of range for job 'worker' with 1 task(s); "
            "expected 0 <= index <= 0. Set task.index to this task's "
            "position in cluster.worker, or add its address there.",
        )

    def test_constructor_raises_task_type_absent_from_cluster(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            _config(_WORKER_CLUSTER, "ps", 0)
        self.assertEqual(raised.exception.field, "task.type")
        self.assertIn("task.type='ps'", str(raised.exception))
        self.assertIn("Add job 'ps'", str(raised.exception))

    def test_constructor_raises_cluster_without_task(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.ClusterConfig(cluster=spec.ClusterSpec(_WORKER_CLUSTER))
        self.assertEqual(raised.exception.field, "task")
        self.assertIn("task=None", str(raised.exception))

    def test_constructor_raises_task_without_cluster(self):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.ClusterConfig(task=spec.TaskSpec("worker", 0))
        self.assertEqual(raised.exception.field, "cluster")
        self.assertIn("task='worker:0'", str(raised.exception))

    @parameterized.named_parameters(
        ("empty", ""),
        ("upper_case", "GRPC"),
        ("url", "grpc://"),
        ("space", "grpc verbs"),
    )
    def test_constructor_raises_bad_rpc_layer(self, rpc_layer):
        with self.assertRaises(errors.ClusterConfigError) as raised:
            spec.ClusterConfig(rpc_layer=rpc_layer)
        self.assertEqual(raised.exception.field, "rpc_layer")
        self.assertIn(f"rpc_layer={rpc_layer!r}", str(raised.exception))
        self.assertIn("Omit rpc_layer", str(raised.exception))

    @parameterized.named_parameters(
        ("cluster_dict", {"cluster": {"worker": ["w:1"]}}),
        ("task_tuple", {"task": ("worker", 0)}),
        ("rpc_layer_none", {"rpc_layer": None}),
    )
    def test_constructor_raises_type_error_wrong_type(self, kwargs):
        with self.assertRaises(TypeError):
            spec.ClusterConfig(**kwargs)

    def test_constructor_rejects_positional_arguments(self):
        with self.assertRaises(TypeError):
            spec.ClusterConfig(None, None)  # type: ignore[misc]


class ImportWithoutTensorFlowTest(absltest.TestCase):
    """spec.py and tf_config.py must import and work without TensorFlow.

    Importing `tfdist.cluster.spec` normally runs `tfdist/__init__.py`, which
    imports TensorFlow. The child process therefore registers empty stand-ins
    for the parent packages (whose `__path__` points at the real folders),
    blocks `tensorflow`, and imports the real submodules.
    """

    def test_spec_and_tf_config_import_with_tensorflow_blocked(self):
        package_dir = pathlib.Path(spec.__file__).parents[1]  # tfdist/
        script = textwrap.dedent(
            f"""
            import sys, types
            sys.modules["tensorflow"] = None  # Any import of it now fails.
            for name, folder in [("tfdist", ""), ("tfdist._internal",
                                 "_internal"), ("tfdist.cluster", "cluster")]:
                package = types.ModuleType(name)
                package.__path__ = [{str(package_dir)!r} + "/" + folder]
                sys.modules[name] = package
            from tfdist.cluster import tf_config
            config = tf_config.parse_tf_config(
                '{{"cluster": {{"worker": ["a:1", "b:1"]}},'
                ' "task": {{"type": "worker", "index": 1}}}}')
            assert config.task.name == "worker:1", config
            heavy = [m for m in sys.modules
                     if m.split(".")[0] in ("tensorflow", "keras", "numpy")
                     and sys.modules[m] is not None]
            print("loaded", sorted(m for m in sys.modules
                                   if m.startswith("tfdist")), heavy)
            """
        )
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self.assertEqual(result.returncode, 0, msg=result.stderr)
        self.assertIn("'tfdist.cluster.spec'", result.stdout)
        self.assertIn("'tfdist.cluster.tf_config'", result.stdout)
        self.assertTrue(result.stdout.rstrip().endswith("[]"), result.stdout)


if __name__ == "__main__":
    absltest.main()
