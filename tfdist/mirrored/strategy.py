"""`tfdist.MirroredStrategy`: data parallelism over one machine's devices.

A drop-in `tf.distribute.MirroredStrategy` whose gradient all-reduce is
tfdist's (`tfdist.collectives.AllReduce`): ring, tree, reduce-to-one or
cost-model "auto", with gradient bucketing and optional fp16/bf16
compression. Variables are mirrored, each replica runs on one device, and
every step's gradients are summed over replicas, so training with global
batch B gives the same weights as one device with batch B.

Datasets are distributed by tfdist's input path (`tfdist/data/distributed/`, through
`tfdist/data/distributed/strategy_input.py`): one pipeline feeds all replicas, each
global batch is cut into per-replica slices, and a last partial batch
trains exactly as on one device.

Host memory. When every replica device is a CPU of this process, the
devices share one memory system and the same cores, so computing the same
update once per device only multiplies memory traffic and ops. There the
strategy:

- applies each variable update once (`update_once_on_host`, the default)
  and copies the result to the other devices:

      update(var, fn, args):             # Keras: args = all-reduced grads
          fn(var.component[0], args[replica 0])  # on device 0
          value = read(var.component[0])
          for each other device d:
              var.component[d].assign(value)

  so only the first device's all-reduce result is consumed and the rest
  of the broadcast is pruned from the graph, and optimizer slots are read
  and written only through the first device's copy.

(Input is read on the host by a plain iterator on every kind of device:
no `MultiDeviceIterator`, whose per-device GeneratorDatasets make TF lower
glibc's trim threshold for the whole process.)

TF's own update runs `fn` on every device with that device's arguments.
Keras passes the all-reduced gradients (equal on every replica) as per-
replica values, so both give the same, bit-identical weights. Arguments
that really differ per replica (an update without an all-reduce) would
make TF's copies of a mirrored variable diverge; here every copy takes the
first replica's update. Variables that are not mirrored (sync-on-read,
e.g. metric accumulators) take TF's per-device path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdist import devices as devices_lib
from tfdist._internal import keras_compat
from tfdist._internal import mirrored_extended
from tfdist.collectives import cost_model as cost_model_lib
from tfdist import errors
from tfdist.collectives import cross_device_ops as cross_device_ops_lib
from tfdist.collectives import fused_step
from tfdist.data import options as data_options
from tfdist.data.distributed import split
from tfdist.data.distributed import strategy_input

__all__ = ["MirroredStrategy"]


class MirroredStrategy(strategy_input.DistributedInputMixin, tf.distribute.MirroredStrategy):
    """Synchronous data parallelism on local devices with tfdist collectives.

    Use exactly like `tf.distribute.MirroredStrategy`: build and compile the
    model under `strategy.scope()`, then call `model.fit` (Keras 3 or
    tf-keras). Each replica gets `global_batch_size / num_replicas_in_sync`
    examples per step.

    Contract: construct it once per process, before building models.
    Arguments are validated before the TensorFlow runtime is touched,
    except device existence, which needs the runtime. Integer values reduced
    through the strategy (rare; not gradients) take TF's
    `ReductionToOneDevice` path, as in TF's own MirroredStrategy.

    Args:
      devices: Device names, one replica each; `None` means all local
        accelerators, else all logical CPUs.
      cross_device_ops: TF's argument: the `tf.distribute.CrossDeviceOps`
        that reduces gradients, a tfdist `AllReduce` (e.g.
        `tfdist.RingAllReduce()`) or any of TF's (e.g.
        `tf.distribute.HierarchicalCopyAllReduce()`); `None`: tfdist's
        `AllReduce` built from the arguments below. Give one or the other.
      all_reduce: "auto" (cost model per bucket, the default), "ring",
        "tree" or "reduce_to_one".
      bucket_bytes: Byte cap of a gradient bucket, >= 1, or `None` for one
        collective per gradient.
      compression: `None`, "fp16" or "bf16" for the gradient transfers
        (sums stay in float32).
      cost_model: A `tfdist.collectives.CostModel` for "auto"; by default it
        is calibrated on `devices` at the first step.
      update_once_on_host: Apply each variable update once and copy it to
        the other devices (see the module docstring). `None`: only when
        every device is a CPU of this process.
      shard_options: `None` to cut each global batch of a plain dataset
        over the replicas, or a `tfdist.data.ShardOptions` to shard it with
        `tfdist.data.shard`.

    Raises:
      ConfigError: Unknown `all_reduce` or `compression`, a non-positive
        `bucket_bytes`, or `cross_device_ops` together with tfdist's
        all-reduce arguments.
      DeviceConfigError: Empty, duplicate or non-existent devices.
      TypeError: Arguments of the wrong type.

    Example:
      >>> strategy = tfdist.MirroredStrategy(all_reduce="ring")
      >>> with strategy.scope():
      ...     model = build_model()
      ...     model.compile(optimizer="adam", loss="mse")
      >>> model.fit(dataset, epochs=3)
    """

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        cross_device_ops: tf.distribute.CrossDeviceOps | None = None,
        *,
        all_reduce: str | None = None,
        bucket_bytes: int | None = cross_device_ops_lib.DEFAULT_BUCKET_BYTES,
        compression: str | None = None,
        cost_model: cost_model_lib.CostModel | None = None,
        update_once_on_host: bool | None = None,
        shard_options: data_options.ShardOptions | None = None,
    ) -> None:
        if update_once_on_host is not None and not isinstance(
            update_once_on_host, bool
        ):
            raise TypeError(
                "update_once_on_host must be True, False or None; received "
                f"update_once_on_host={update_once_on_host!r}."
            )
        # Before resolve_local_devices, which starts the TF runtime.
        _check_cross_device_ops(
            cross_device_ops,
            all_reduce=all_reduce,
            bucket_bytes=bucket_bytes,
            compression=compression,
            cost_model=cost_model,
        )
        if cross_device_ops is None:
            cross_device_ops_lib.check_options(
                all_reduce or "auto", bucket_bytes, compression
            )
        strategy_input.check_shard_options(shard_options)
        resolved = devices_lib.resolve_local_devices(devices)
        host_memory = devices_lib.share_host_memory(resolved)
        if update_once_on_host is None:
            update_once_on_host = len(resolved) > 1 and host_memory
        results_needed = "first" if update_once_on_host else "all"
        if cross_device_ops is None:
            reducer: tf.distribute.CrossDeviceOps = cross_device_ops_lib.AllReduce(
                all_reduce or "auto",
                bucket_bytes=bucket_bytes,
                compression=compression,
                cost_model=cost_model,
                results_needed=results_needed,
            )
        elif isinstance(cross_device_ops, cross_device_ops_lib.AllReduce):
            reducer = cross_device_ops.with_results_needed(results_needed)
        else:
            reducer = cross_device_ops
        extended = _MirroredExtended(
            self,
            devices=list(resolved),
            cross_device_ops=reducer,
            update_once=update_once_on_host,
        )
        # tf.distribute.MirroredStrategy.__init__ only builds TF's
        # MirroredExtended; this is that body with tfdist's subclass.
        tf.distribute.Strategy.__init__(self, extended)
        self._all_reduce_op = reducer
        self._update_once_on_host = update_once_on_host
        self._shard_options = shard_options

    @property
    def cross_device_ops(self) -> tf.distribute.CrossDeviceOps:
        """The gradient reducer (a tfdist `AllReduce` unless TF's was given)."""
        return self._all_reduce_op

    @property
    def update_once_on_host(self) -> bool:
        """Whether updates run once and are copied (see module docstring)."""
        return self._update_once_on_host

    @property
    def shard_options(self) -> data_options.ShardOptions | None:
        """How plain datasets are sharded (`None`: each global batch is cut)."""
        return self._shard_options

    def _train_step_fusion(self, step: keras_compat.KerasStep) -> Any:
        """Keras 3's step with a clipping or loss-scaling optimizer: its update on the sum.

        Keras 3 clips (and checks for finiteness) each replica's part of the
        gradient before summing; one device does it to the whole gradient
        (`tfdist/collectives/fused_step.py`). The logs are reduced as Keras
        writes them.
        """
        optimizer = getattr(step.model, "optimizer", None)
        if (
            optimizer is None
            or not keras_compat.adjusts_replica_gradients(optimizer)
            or not keras_compat.computes_metrics_as_keras(step.model)
        ):
            return None
        return fused_step.StepFusion(self, step, logs_ride=False)

    def _input_layout(self) -> split.InputLayout:
        return split.InputLayout(
            num_replicas_in_sync=self.num_replicas_in_sync,
            num_workers=1,
            worker_index=0,
        )


class _MirroredExtended(mirrored_extended.UpdateHookExtended):  # type: ignore[misc]
    """TF's MirroredExtended with the update-once path for host memory."""

    def __init__(
        self,
        container_strategy: MirroredStrategy,
        *,
        devices: list[str],
        cross_device_ops: tf.distribute.CrossDeviceOps,
        update_once: bool,
    ) -> None:
        super().__init__(
            container_strategy, devices=devices, cross_device_ops=cross_device_ops
        )
        self._update_once = update_once

    def update_variable(
        self, var: Any, fn: Any, args: Any, kwargs: Any, group: bool, *, default: Any
    ) -> Any:
        # Behind StrategyExtended.update: Keras's optimizer applies every
        # gradient through it, with the all-reduced gradient as a
        # PerReplica value (identical on every replica).
        if not (self._update_once and mirrored_extended.is_mirrored_variable(var)):
            return default()
        components = var.values
        primary = components[0]
        with tf.device(primary.device), mirrored_extended.update_context(0), tf.name_scope(
            "update_0"
        ):
            result = fn(
                primary,
                *mirrored_extended.select_replica(0, args),
                **mirrored_extended.select_replica(0, kwargs),
            )
            # Ordered after `fn` by automatic control dependencies (same
            # resource) inside tf.function, and by program order eagerly.
            value = primary.read_value()
        updates = [result]
        for index, component in enumerate(components[1:], start=1):
            with tf.device(component.device), mirrored_extended.update_context(index):
                copied = component.assign(value)
            updates.append(tf.nest.map_structure(lambda _: copied, result))
        return mirrored_extended.update_regroup(self, updates, group)


def _check_cross_device_ops(
    cross_device_ops: object,
    *,
    all_reduce: str | None,
    bucket_bytes: int | None,
    compression: str | None,
    cost_model: object,
) -> None:
    """Checks TF's `cross_device_ops` argument against tfdist's own."""
    if cross_device_ops is None:
        return
    if not isinstance(cross_device_ops, tf.distribute.CrossDeviceOps):
        raise TypeError(
            "cross_device_ops must be a tf.distribute.CrossDeviceOps (a tfdist "
            "AllReduce such as tfdist.RingAllReduce(), or one of TF's); "
            f"received cross_device_ops={cross_device_ops!r} of type "
            f"{type(cross_device_ops).__name__}."
        )
    given = {
        name: value
        for name, value, default in (
            ("all_reduce", all_reduce, None),
            ("bucket_bytes", bucket_bytes, cross_device_ops_lib.DEFAULT_BUCKET_BYTES),
            ("compression", compression, None),
            ("cost_model", cost_model, None),
        )
        if value is not default
    }
    if given:
        settings = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise errors.ConfigError(
            f"cross_device_ops={cross_device_ops!r} and {settings} both say "
            "how to reduce gradients. Pass the settings to the AllReduce "
            "you give (e.g. tfdist.AllReduce('ring', bucket_bytes=...)), or "
            "drop cross_device_ops."
        )
