"""A mesh over the workers of a TF_CONFIG cluster: TF's DTensor in multi-client mode.

Every worker runs the same script; each is one DTensor client holding its
own L devices, and the mesh spans all of them. The batch axis comes first,
and the other axes (the model's) stay inside one worker: each batch
position is a group of `inner` devices of one worker (tensor parallelism
inside a host, data parallelism between hosts, the usual layout).

Which worker holds which batch position follows the input: tfdist's
datasets give worker w, of W, the slices w, w + W, w + 2W, ... of every
global batch (TF's order of replicas across workers), so batch position p
is on worker p mod W, in its local devices' group p // W (`make_mesh`).
The mesh's batch dimension is then the global batch in its own order, and
`predict` returns rows as one device does.

    TF_CONFIG (workers only)  ->  DTENSOR_JOBS / CLIENT_ID / NUM_CLIENTS / JOB_NAME
                              ->  dtensor.initialize_accelerator_system (starts the
                                  cluster runtime; before anything else starts TF's)
                              ->  a dtensor.Mesh in the input's order (`make_mesh`)

Input: each worker reads only its rows of every global batch, as the
multi-worker strategy's workers do (`tfdist.data.distributed`: one pipeline
per worker, the chief's tf.data service where the workers' pipelines
cannot agree), and packs them onto its own devices (`pack_local`; a short
last batch is gathered whole onto every device).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from tfdist import errors
from tfdist._internal import input_values
from tfdist.cluster import ClusterConfig
from tfdist.mesh import layouts as layouts_lib

__all__ = ["check_mesh", "is_multi_client", "make_mesh", "pack_local", "start"]

#: The cluster DTensor's runtime was started for in this process, if any.
_started: ClusterConfig | None = None


def is_multi_client(config: ClusterConfig) -> bool:
    """Whether `config` is a cluster of several training tasks (the mesh spans them)."""
    return config.cluster is not None and config.task is not None and config.num_workers > 1


def start(config: ClusterConfig) -> tuple[str, ...]:
    """Starts DTensor's multi-client runtime for `config`; returns every device of the cluster.

    Who calls: `MeshStrategy`, on every worker, before anything else starts
    TensorFlow's runtime in the process (a tensor, a device listing). Blocks
    until every worker has started (TF's coordination service). A second
    call for the same cluster returns the same devices; for another, an
    error (DTensor's runtime cannot be restarted in a process).

    Returns:
      Device names, worker-major ("/job:worker/replica:0/task:1/device:CPU:0").

    Raises:
      ConfigError: A cluster with a chief, ps or evaluator task; TensorFlow
        already started in this process; a second, different cluster.
    """
    global _started
    assert config.cluster is not None and config.task is not None
    others = [job for job in config.cluster.job_names if job != "worker"]
    if others:
        raise errors.ConfigError(
            f"a MeshStrategy cluster is made of worker tasks only; TF_CONFIG's cluster also "
            f"has {others}. Give every task of the job the type 'worker' (tfdist.launch "
            "--workers N, without --chief or --ps)."
        )
    if _started is not None:
        if _started != config:
            raise errors.ConfigError(
                "TF's DTensor runtime was started in this process for another cluster; a "
                "process runs on one cluster. Start one process per job."
            )
    else:
        workers = config.cluster.addresses("worker")
        os.environ.update(
            DTENSOR_JOBS=",".join(workers),
            DTENSOR_CLIENT_ID=str(config.task.task_id),
            DTENSOR_NUM_CLIENTS=str(len(workers)),
            DTENSOR_JOB_NAME="worker",
        )
        try:
            dtensor.initialize_accelerator_system(_device_type())
        except ValueError as error:
            if "already been initialized" not in str(error):
                raise
            raise errors.ConfigError(
                "MeshStrategy on a TF_CONFIG cluster starts TF's DTensor runtime, which must "
                "come before anything else starts TensorFlow's in the process (received: "
                f"{error}). Create the strategy first thing after configuring devices "
                "(tfdist.simulate_cpu_devices), before any tensor, model or device listing."
            ) from error
        _started = config
    device_type = _device_type()
    local = len(dtensor.local_devices(device_type))
    return tuple(
        f"/job:worker/replica:0/task:{task}/device:{device_type}:{index}"
        for task in range(config.num_workers)
        for index in range(local)
    )


def make_mesh(
    spec: layouts_lib.MeshSpec, batch_dim_name: str, config: ClusterConfig
) -> dtensor.Mesh:
    """DTensor's mesh across the workers, batch position p on worker p mod W (module docstring).

    Who calls: `MeshStrategy`, after `start` and `check_mesh`.
    """
    assert config.task is not None
    workers, worker = config.num_workers, config.task.task_id  # Workers only: index = task id.
    local = spec.size // workers
    inner = spec.size // spec.axis_size(batch_dim_name)
    device_type = _device_type()
    local_ids, local_devices = [], []
    for group in range(local // inner):
        position = group * workers + worker
        for offset in range(inner):
            local_ids.append(position * inner + offset)
            local_devices.append(
                f"/job:worker/replica:0/task:{worker}/device:{device_type}:"
                f"{group * inner + offset}"
            )
    return dtensor.Mesh(
        list(spec.axis_names),
        np.arange(spec.size).reshape(spec.shape),
        local_ids,
        local_devices,
    )


def _device_type() -> str:
    return "GPU" if tf.config.list_physical_devices("GPU") else "CPU"


def check_mesh(spec: layouts_lib.MeshSpec, batch_dim_name: str, num_workers: int) -> None:
    """Raises `LayoutError` unless the batch axis runs between workers and the rest inside one.

    Each batch position is a group of devices of one worker (`make_mesh`),
    so that holds when the batch axis is the first and the product of the
    others divides a worker's devices.
    """
    local = spec.size // num_workers
    inner = spec.size // spec.axis_size(batch_dim_name)
    if spec.axis_names[0] != batch_dim_name or local % inner:
        raise errors.LayoutError(
            f"on a cluster of {num_workers} workers with {local} device(s) each, the mesh "
            f"{dict(zip(spec.axis_names, spec.shape))} must put the batch axis "
            f"{batch_dim_name!r} first and keep the other axes inside one worker (their "
            f"sizes' product, {inner}, must divide {local}). Name the batch axis first, "
            f"and size the others to divide {local}."
        )


def pack_local(
    value: Any, mesh: dtensor.Mesh, batch_dim_name: str, spec: layouts_lib.MeshSpec
) -> tf.Tensor:
    """This worker's replica slices of one input leaf, as one DTensor of the global batch.

    `value` is an input value of tfdist's distributed datasets: one slice
    per batch position this worker holds, in `make_mesh`'s order, and the
    global batch's rows. A global batch the batch axis divides is split
    along it, every local device holding the slice of its batch position
    (the devices along the other axes share it). One it does not divide
    (an epoch's short last batch) goes whole to every device, as in one
    process: each worker pads its slices to the largest slice's rows, the
    padded batch is gathered onto every device, and the padding is dropped
    (one all-gather, at that batch only). Every worker decides alike, from
    the global batch's rows.

    Raises:
      LayoutError: Slices of different sizes in a batch whose global rows
        the input does not know (a pipeline tfdist did not batch).
    """
    slices: Sequence[tf.Tensor] = (
        value.values if input_values.is_input_value(value) else (value,)
    )
    rank = slices[0].shape.rank or 0
    positions = spec.axis_size(batch_dim_name)
    inner = spec.size // positions
    split = dtensor.Layout([batch_dim_name] + [dtensor.UNSHARDED] * (rank - 1) if rank else [], mesh)
    global_rows = (
        int(value.global_rows) if input_values.is_input_value(value) else input_values.UNKNOWN_ROWS
    )
    sizes = [int(s.shape[0]) for s in slices] if rank else [0]
    if global_rows == input_values.UNKNOWN_ROWS:
        if len(set(sizes)) > 1:
            raise errors.LayoutError(
                f"a batch the mesh's batch axis ({positions} positions) does not divide reached "
                f"a mesh across workers (slices of {sorted(set(sizes))} rows), from a pipeline "
                "whose global batch size is not known. Batch it with batches the axis "
                "divides (dataset.batch(..., drop_remainder=True))."
            )
        global_rows = sizes[0] * positions
    def per_device(parts: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        # Local device i holds batch position group i // inner.
        return [parts[i // inner] for i in range(len(parts) * inner)]

    if not rank or global_rows % positions == 0:
        return dtensor.pack(per_device(slices), split)
    largest = -(-global_rows // positions)
    padded = [
        tf.pad(s, [[0, largest - int(s.shape[0])]] + [[0, 0]] * (rank - 1)) for s in slices
    ]
    gathered = dtensor.relayout(
        dtensor.pack(per_device(padded), split),
        dtensor.Layout.replicated(mesh, rank),
    )
    quotient, extra = divmod(global_rows, positions)
    rows = [p * largest + i for p in range(positions) for i in range(quotient + (p < extra))]
    indices = dtensor.copy_to_mesh(tf.constant(rows, tf.int64), dtensor.Layout.replicated(mesh, 1))
    return tf.gather(gathered, indices)
