"""TF_CONFIG clusters: parse, validate, and hand to TensorFlow.

    config = tfdist.cluster.parse_tf_config()   # reads TF_CONFIG once
    config.task.name, config.is_chief           # ('worker:1', False)
    resolver = tfdist.cluster.to_cluster_resolver(config)

`parse_tf_config` turns TF_CONFIG into a frozen `ClusterConfig` (a
`ClusterSpec` of jobs and addresses, this process's `TaskSpec`, and the
`rpc_layer`), raising `tfdist.errors.ClusterConfigError` with the offending
`field` for anything malformed. `ClusterConfig.to_json()` writes TF_CONFIG
back, for launchers. `to_cluster_resolver` adapts a config to the
`tf.distribute.cluster_resolver.ClusterResolver` that TF strategies take.

`make_local_cluster` and `LocalJob` (the engine of `python -m
tfdist.launch`) run a cluster as local processes on 127.0.0.1;
`cluster_from_hosts` and `tfjob_manifest` describe the same job for real
hosts or Kubeflow.

`spec`, `tf_config` and `launcher` import nothing from TensorFlow;
`resolver` does.
"""

from __future__ import annotations

from tfdist.cluster.launcher import JobOutcome
from tfdist.cluster.launcher import JobResult
from tfdist.cluster.launcher import LocalJob
from tfdist.cluster.launcher import TaskResult
from tfdist.cluster.launcher import cluster_from_hosts
from tfdist.cluster.launcher import make_local_cluster
from tfdist.cluster.launcher import run_local_job
from tfdist.cluster.launcher import tfjob_manifest
from tfdist.cluster.resolver import to_cluster_resolver
from tfdist.cluster.spec import DEFAULT_RPC_LAYER
from tfdist.cluster.spec import TASK_TYPES
from tfdist.cluster.spec import Address
from tfdist.cluster.spec import ClusterConfig
from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.spec import TaskSpec
from tfdist.cluster.spec import TaskType
from tfdist.cluster.tf_config import TF_CONFIG_ENV_VAR
from tfdist.cluster.tf_config import parse_tf_config

__all__ = [
    "DEFAULT_RPC_LAYER",
    "TASK_TYPES",
    "TF_CONFIG_ENV_VAR",
    "Address",
    "ClusterConfig",
    "ClusterSpec",
    "JobOutcome",
    "JobResult",
    "LocalJob",
    "TaskResult",
    "TaskSpec",
    "TaskType",
    "cluster_from_hosts",
    "make_local_cluster",
    "parse_tf_config",
    "run_local_job",
    "tfjob_manifest",
    "to_cluster_resolver",
]
