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

Running a cluster as local processes (`python -m tfdist.launch`) is
`tfdist.launch`'s job.

`spec` and `tf_config` import nothing from TensorFlow; `resolver` does, and
is imported on first use of `to_cluster_resolver` (PEP 562), so importing
this package does not import TensorFlow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from tfdist.cluster.spec import DEFAULT_RPC_LAYER
from tfdist.cluster.spec import TASK_TYPES
from tfdist.cluster.spec import Address
from tfdist.cluster.spec import ClusterConfig
from tfdist.cluster.spec import ClusterSpec
from tfdist.cluster.spec import TaskSpec
from tfdist.cluster.spec import TaskType
from tfdist.cluster.tf_config import TF_CONFIG_ENV_VAR
from tfdist.cluster.tf_config import parse_tf_config

if TYPE_CHECKING:  # Imported on first use: see __getattr__.
    from tfdist.cluster.resolver import to_cluster_resolver

__all__ = [
    "DEFAULT_RPC_LAYER",
    "TASK_TYPES",
    "TF_CONFIG_ENV_VAR",
    "Address",
    "ClusterConfig",
    "ClusterSpec",
    "TaskSpec",
    "TaskType",
    "parse_tf_config",
    "to_cluster_resolver",
]


def __getattr__(name: str) -> Any:  # Any: the type of the name asked for.
    """Imports `to_cluster_resolver` (and TensorFlow) on first access."""
    if name == "to_cluster_resolver":
        from tfdist.cluster import resolver

        globals()[name] = resolver.to_cluster_resolver
        return resolver.to_cluster_resolver
    raise AttributeError(f"module 'tfdist.cluster' has no attribute {name!r}")
