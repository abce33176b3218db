"""Adapts a `ClusterConfig` to the `ClusterResolver` TF strategies take.

TensorFlow's multi-worker strategies learn their cluster from a
`tf.distribute.cluster_resolver.ClusterResolver`. `to_cluster_resolver`
builds a `SimpleClusterResolver` that answers what `TFConfigClusterResolver`
answers for the TF_CONFIG `config.to_json()` (cluster, task, rpc_layer,
master), but from the already-validated config instead of re-reading the
environment:

    config = tfdist.cluster.parse_tf_config()
    resolver = tfdist.cluster.to_cluster_resolver(config)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver)

`num_accelerators` is left to TensorFlow, which counts the local devices.
One deliberate difference: where TF_CONFIG names no `rpc_layer`,
`TFConfigClusterResolver` reports `None` (and TF's strategies then use
"grpc"), while this resolver reports "grpc" explicitly.
"""

from __future__ import annotations

import tensorflow as tf  # type: ignore[import-untyped]

from tfdist import errors
from tfdist.cluster import spec
from tfdist.cluster import tf_config

__all__ = ["from_cluster_resolver", "resolve_cluster", "to_cluster_resolver"]


class _ConfigClusterResolver(
    tf.distribute.cluster_resolver.SimpleClusterResolver
):
    """A `SimpleClusterResolver` whose `master()` is `TFConfigClusterResolver`'s.

    `SimpleClusterResolver.master()` prefixes the rpc_layer even to an empty
    master, giving `"grpc://"`; TF_CONFIG's resolver gives `""` where there
    is no remote master (no cluster, or a one-task cluster).
    """

    def __init__(self, config: spec.ClusterConfig) -> None:
        if config.cluster is None or config.task is None:
            super().__init__(
                tf.train.ClusterSpec({}), rpc_layer=config.rpc_layer
            )
            self._has_remote_master = False
            return
        self._has_remote_master = config.cluster.num_tasks > 1
        super().__init__(
            tf.train.ClusterSpec(config.cluster.to_dict()),
            master=config.cluster.address(config.task),
            task_type=config.task.task_type,
            task_id=config.task.task_id,
            rpc_layer=config.rpc_layer,
        )

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """Returns `"<rpc_layer>://<address>"` of the task, or `""`.

        Args:
          task_type: With `task_id`, the task to address instead of this one.
          task_id: With `task_type`, the task to address instead of this one.
          rpc_layer: Protocol for the URL instead of the config's.

        Returns:
          The master URL; `""` for this task when the config is local or the
          cluster has a single task, as `TFConfigClusterResolver` answers.
        """
        if (task_type is None or task_id is None) and not (
            self._has_remote_master
        ):
            return ""
        result: str = super().master(task_type, task_id, rpc_layer)
        return result


def to_cluster_resolver(
    config: spec.ClusterConfig,
) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
    """Returns a `SimpleClusterResolver` describing `config`.

    Creating the resolver starts no server and touches no devices.

    Args:
      config: A validated config, from `parse_tf_config()` or built directly.

    Returns:
      A resolver whose `cluster_spec().as_dict()` is `config.cluster.to_dict()`
      (`{}` for a local config), whose `task_type`, `task_id` are the
      config's task (`None` for a local config), and whose `rpc_layer` is
      `config.rpc_layer`. `master()` is `"<rpc_layer>://<address>"` of the
      task, or `""` for a local config or a one-task cluster, as
      `TFConfigClusterResolver` answers.

    Raises:
      TypeError: If `config` is not a `ClusterConfig`.

    Example:
      >>> resolver = to_cluster_resolver(
      ...     parse_tf_config(
      ...         '{"cluster": {"worker": ["h0:2222", "h1:2222"]},'
      ...         ' "task": {"type": "worker", "index": 1}}'
      ...     )
      ... )
      >>> resolver.task_type, resolver.task_id, resolver.master()
      ('worker', 1, 'grpc://h1:2222')
    """
    if not isinstance(config, spec.ClusterConfig):
        raise TypeError(
            "config must be a tfdist.cluster.ClusterConfig; received "
            f"config of type {type(config).__name__}. Build one with "
            "tfdist.cluster.parse_tf_config()."
        )
    return _ConfigClusterResolver(config)


def from_cluster_resolver(
    resolver: tf.distribute.cluster_resolver.ClusterResolver,
) -> spec.ClusterConfig:
    """Returns the validated `ClusterConfig` a TF `ClusterResolver` describes.

    Reads `cluster_spec()`, `task_type`, `task_id` and `rpc_layer` once, as
    TF's strategies do, and validates them as TF_CONFIG would be.

    Raises:
      TypeError: If `resolver` is not a `ClusterResolver`.
      ClusterConfigError: If the resolver's cluster or task is malformed
        (e.g. sparse task indices, a task outside the cluster).
    """
    if not isinstance(resolver, tf.distribute.cluster_resolver.ClusterResolver):
        raise TypeError(
            "cluster_resolver must be a tf.distribute.cluster_resolver."
            f"ClusterResolver; received {resolver!r} of type "
            f"{type(resolver).__name__}."
        )
    jobs = resolver.cluster_spec().as_dict()
    document: dict[str, object] = {}
    if jobs:
        document["cluster"] = jobs
        document["task"] = {"type": resolver.task_type, "index": resolver.task_id}
    if resolver.rpc_layer:
        document["rpc_layer"] = resolver.rpc_layer
    return tf_config.parse_tf_config(document)


def resolve_cluster(
    cluster: object, cluster_resolver: object = None
) -> spec.ClusterConfig:
    """The cluster a strategy runs on, from any of the ways users give it.

    Args:
      cluster: A `ClusterConfig`, a TF_CONFIG JSON string or dict, a TF
        `ClusterResolver` (TF's strategies take one as their first
        argument), or None to read the `TF_CONFIG` environment variable.
      cluster_resolver: TF's keyword for the same; give one or the other.

    Raises:
      ConfigError: If both are given.
      ClusterConfigError, TypeError: If the cluster is invalid.
    """
    if cluster is not None and cluster_resolver is not None:
        raise errors.ConfigError(
            "pass the cluster once: received both cluster="
            f"{cluster!r} and cluster_resolver={cluster_resolver!r}. Keep "
            "cluster_resolver= (TF's name) or cluster=, not both."
        )
    if cluster_resolver is not None:
        return from_cluster_resolver(cluster_resolver)  # type: ignore[arg-type]
    if isinstance(cluster, spec.ClusterConfig):
        return cluster
    if isinstance(cluster, tf.distribute.cluster_resolver.ClusterResolver):
        return from_cluster_resolver(cluster)
    return tf_config.parse_tf_config(cluster)  # type: ignore[arg-type]
