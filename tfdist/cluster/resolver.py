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

from tfdist.cluster import spec

__all__ = ["to_cluster_resolver"]


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
