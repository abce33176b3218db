"""tfdist's uses of tf.data: reading a pipeline's graph (TF internals), starting a tf.data service.

Private TF API used (tested range: see setup.py):

- `tf.data.Dataset._as_serialized_graph`: the pipeline's `GraphDef` (what
  TF's own tf.data service and auto-sharding serialize); used to find
  what makes copies of a pipeline differ (`tfdist/data/distributed/determinism.py`);
- `dataset_options_pb2.Options`: the serialized `tf.data.Options` of an
  `OptionsDataset` node;
- `data.experimental.ops.distribute.compute_batch_size`: the batch size of
  a pipeline from its graph, without iterating it (what TF's rebatching
  uses);
- `DatasetFromGraph` (`tf.raw_ops`, public) with `from_variant`: a pipeline
  rebuilt from an edited graph (in this process, so the resources and
  Python functions it refers to are still there).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from absl import logging
from tensorflow.core.framework import dataset_options_pb2 as _options_pb2
from tensorflow.python.data.experimental.ops import distribute as _data_distribute

__all__ = [
    "batch_size",
    "dataset_from_graph",
    "options_allow_reordering",
    "pipeline_graph",
    "start_local_service",
]

#: Abandoned service jobs (e.g. Keras's peek at one batch) are freed after this long.
_JOB_GC_TIMEOUT_MS = 30_000


def pipeline_graph(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
    """The `GraphDef` of `dataset`'s pipeline, with its function library.

    Python functions (`from_generator`, `py_function`) appear as their ops;
    resources are not followed. Must be called eagerly.
    """
    serialized = dataset._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE,
        strip_device_assignment=True,
    )
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized.numpy())
    return graph


def options_allow_reordering(serialized_options: bytes) -> bool:
    """Whether serialized `tf.data.Options` set `deterministic=False`."""
    options = _options_pb2.Options()
    options.ParseFromString(serialized_options)
    return options.WhichOneof("optional_deterministic") is not None and not (
        options.deterministic
    )


def batch_size(dataset: tf.data.Dataset) -> int | None:
    """The size `dataset` was batched with (partial batches aside), or None.

    Read from the pipeline's graph (its last `batch` or `padded_batch`);
    None when no batching op is found, batch sizes contradict each other,
    or a later op may change it. Creates no iterator, so a reshuffling
    pipeline is not advanced. Must be called eagerly.
    """
    size = int(_data_distribute.compute_batch_size(dataset))
    return size if size > 0 else None


def dataset_from_graph(graph: tf.compat.v1.GraphDef, element_spec: object) -> tf.data.Dataset:
    """The pipeline `graph` describes (from `pipeline_graph`, possibly edited).

    Must be called eagerly, in the process that made the graph.
    """
    variant = tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
    return tf.data.experimental.from_variant(variant, element_spec)


def start_local_service(host: str) -> tuple[tuple[Any, Any], str]:
    """Starts a tf.data dispatcher and one tf.data worker in this process.

    Both listen on free ports (TF's gRPC servers accept connections on
    every interface); the worker tells readers to fetch from `host`.
    Returns the two servers (they stop when garbage-collected: keep them)
    and the dispatcher's address, `host:port`.
    """
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(
        service.DispatcherConfig(port=0, job_gc_timeout_ms=_JOB_GC_TIMEOUT_MS)
    )
    port = int(dispatcher.target.rsplit(":", 1)[1])
    worker = service.WorkerServer(
        service.WorkerConfig(
            dispatcher_address=f"localhost:{port}",
            worker_address=f"{host}:%port%",
            port=0,
        )
    )
    address = f"{host}:{port}"
    logging.info("tfdist: input served by a tf.data service at %s.", address)
    return (dispatcher, worker), address
