"""tfdist.MeshStrategy: tensor (intra-layer) and data parallelism over a device mesh.

    mesh = keras.distribution.DeviceMesh((2, 2), ("batch", "model"), devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*dense.*kernel"] = (None, "model")     # column-parallel Dense
    layout_map[".*dense_1.*kernel"] = ("model", None)   # row-parallel Dense
    strategy = tfdist.MeshStrategy(mesh, layout_map=layout_map, batch_dim_name="batch")
    with strategy.scope():
        model = build_model()
        model.compile(...)
    model.fit(dataset, epochs=3)
    print(strategy.layout_report())

How it runs (ARCHITECTURE.md, "The mesh strategy"): TF's DTensor holds every
variable the scope creates as one slice per device of the mesh, split as
its layout says (`_extended.py`); each batch goes onto the mesh split along
`batch_dim_name` (whole along the other axes); the step runs as one program
on all devices, and DTensor's SPMD expansion adds the collectives the
layouts need: for a column-then-row Dense pair, one all-reduce of the
activations forward and one backward (as Megatron-LM pairs them), and the
gradients' all-reduce over the batch axis. So the model trains as on one
device with the same global batch, up to float32 rounding.

Keras's loop: Keras 3 reads each batch through the strategy's dataset
(`experimental_distribute_dataset`, which yields batches already on the
mesh), and the strategy gives the model, for this model only, step
functions that compile Keras's own `train_step` / `test_step` /
`predict_step` once per input signature and call them on those batches
(`tfdist/_internal/keras_ps.install_functions`, as the parameter-server
strategy does). A custom loop iterates the distributed dataset eagerly and
calls a `tf.function` with each batch inside `strategy.run`, the loss
taken as TF's custom training tutorial takes it (`reduction="none"`, then
`tf.nn.compute_average_loss`; tf-keras refuses a default reduction inside
any strategy). Each step is traced with a variable's writes
forwarded to its later reads (`_dtensor.forwarded_writes`): TF's DTensor
does not always keep a read after its write in order.

Across workers (a TF_CONFIG cluster of workers, e.g. under `tfdist.launch
--workers N`): every worker builds the same strategy, the mesh spans every
worker's devices, the batch axis first and the others inside one worker;
each worker reads only its rows of every global batch (`_multi_client.py`).

Limits of this version: layouts
chosen automatically are Megatron's simple rules, per variable as it is
created (no search over the model); an embedding table split by columns
trains where TF's DTensor compiles the step (an embedding bag, tested) and is
refused with a `LayoutError` where it does not (Keras 3's transformer block); a last batch the batch axis does not
divide runs whole on every device (correct, not split; across workers, gathered from the workers' rows);
under tf-keras, what TF's DTensor cannot lay out is refused with a `LayoutError` naming the fix (fused
batch norm, stateful random ops), and its layer norms take tf-keras's unfused path.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from absl import logging
from tensorflow.experimental import dtensor

from tfdist import cluster as cluster_lib
from tfdist import devices as devices_lib
from tfdist import errors
from tfdist import _validation as validation
from tfdist._internal import keras_layers
from tfdist._internal import keras_ps
from tfdist._internal import tf_errors
from tfdist.data.distributed import data_service
from tfdist.data.distributed import dataset as dataset_lib
from tfdist.data.distributed import distribute
from tfdist.data.distributed import iterator_reaper
from tfdist.data.distributed import split
from tfdist.mesh import _dtensor
from tfdist.mesh import _extended
from tfdist.mesh import _multi_client
from tfdist.mesh import layouts as layouts_lib
from tfdist.watchdog import peer_watchdog

__all__ = ["MeshStrategy"]

#: How long a worker waits for the chief's input service (seconds).
_INPUT_TIMEOUT_S = 60.0

#: How TF's DTensor refuses what it cannot lay out (in its UnknownError,
#: which names no layer), and what tfdist says instead: (pattern, message;
#: "{op}" is the pattern's first group, "{kernels}" the split kernels,
#: "{columns}" the tables split by columns).
_REFUSALS = (
    (r"EmitAllScatter was passed a desired_layout",
     "TF's DTensor cannot compile this model's step with an embedding table split along "
     "a dimension other than its rows ({columns}): the lookup's row gradients meet another "
     "layout there. Split the table by rows (('model', None) in layout_map) or keep it "
     "whole (leave it out of layout_map)."),
    (r"Filter for convolution must have fully replicated layout",
     "TF's DTensor computes a convolution only with its whole filter, and a convolution "
     "kernel of this model is split by layout_map ({kernels}). Keep convolution kernels "
     "whole (leave them out of layout_map); split the Dense and attention layers around them."),
    (r"Stateful random operations are not supported in DTensor",
     "TF's DTensor cannot run stateful random ops, which tf-keras's Dropout and other "
     "random layers draw with (Keras 3's draw statelessly). Under tf-keras train this "
     "model without them on a mesh (e.g. dropout rate 0), or use Keras 3."),
    (r"'tf\.(\w+)' op does not implement layout propagation",
     "TF's DTensor cannot run op {op!r} of this model's step on a mesh (it has no layout "
     "rule for it). tf-keras's BatchNormalization computes with FusedBatchNormV3, for "
     "example. Use the layer's Keras 3 counterpart, or another tfdist strategy for this model."),
)


class MeshStrategy(tf.distribute.Strategy):
    """Splits variables over a device mesh by layout, and batches over one axis of it.

    Args:
      mesh: A `keras.distribution.DeviceMesh` (Keras 3), a
        `tfdist.mesh.DeviceMesh` (the same, for tf-keras), or `{axis_name:
        size}` over this process's devices (`tfdist.local_devices()`, in
        order; e.g. `{"batch": 2, "model": 2}` on 4 devices). On a
        TF_CONFIG cluster of N workers: `{axis_name: size}` over every
        worker's devices, worker-major, the batch axis first (e.g.
        `{"batch": 4, "model": 2}` on 2 workers of 4 devices).
      layout_map: A `keras.distribution.LayoutMap`, a `tfdist.mesh.LayoutMap`,
        or a dict, from a regular expression matching a variable's whole
        path to its axes. The path is Keras 3's `variable.path` (e.g.
        "sequential/dense/kernel"); under tf-keras the variable's name
        without ":0" (e.g. "dense/kernel"). Axes: one entry per
        dimension, a mesh axis name (split over that axis) or None (whole).
        Unmatched variables are whole on every device; an optimizer's slots
        follow their variable. `{}` keeps every variable whole (data
        parallelism only). None: Megatron's layouts, chosen as the model is
        built (`tfdist.mesh.layouts.AutomaticLayouts`: attention by heads,
        Dense layers in column-then-row pairs, embedding tables by rows,
        only where the axis divides the dimension; convolutions whole, as
        TF's DTensor convolves only whole filters);
        `layout_report()` says which rule chose each.
      batch_dim_name: The mesh axis each batch is split over (data
        parallelism); by default the mesh's first axis, as in Keras's
        `ModelParallel`.
      timeout_s: On a cluster, the bound on one step (its first one's
        compilation included) while a peer is alive but not taking part,
        seconds (> 0); default 300. Unused in one process.

    Contract on a cluster: every worker creates the strategy, first thing
    after configuring its devices (it starts TF's DTensor runtime, which
    must come before anything else starts TensorFlow's; it blocks until
    every worker has), and runs the same steps on the same datasets. A
    watchdog thread then probes the other workers (`tfdist/watchdog/`): when
    one is lost, every collective of this process is aborted and the
    waiting `fit` raises `WorkerUnavailableError` naming it, within a few
    seconds; a step still running after `timeout_s` is aborted with
    `CollectiveTimeoutError` naming the workers behind. After either, this
    process cannot run collectives again: restart the job. Keras's loops
    wait for each step before the next (TF's DTensor runs steps
    asynchronously); a custom loop on a cluster reads its results to see
    its errors.

    Raises:
      ConfigError: A non-positive `timeout_s`; on a TF_CONFIG cluster: a
        task other than a worker, or TensorFlow already started.
      LayoutError: A mesh whose size is not its number of devices, a layout
        naming an axis the mesh lacks, a `batch_dim_name` not in the mesh,
        on a cluster a batch axis that is not first or other axes that
        span workers;
        when the model is built, a variable whose split dimension its axis
        does not divide (naming the variable); at the first step, what
        TF's DTensor cannot compile, naming the fix (a table split by
        columns in some models, a split convolution filter, ops it has no
        layout rule for).
    """

    def __init__(
        self,
        mesh: Any,
        layout_map: Any = None,
        batch_dim_name: str | None = None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        timeout = validation.check_positive_number(
            "timeout_s", peer_watchdog.DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)
        config = cluster_lib.parse_tf_config()
        cluster = config if _multi_client.is_multi_client(config) else None
        devices = devices_lib.local_devices() if cluster is None else _multi_client.start(cluster)
        spec = layouts_lib.MeshSpec.from_user(mesh, devices)
        batch_dim_name = spec.axis_names[0] if batch_dim_name is None else batch_dim_name
        if batch_dim_name not in spec.axis_names:
            raise errors.LayoutError(
                f"batch_dim_name={batch_dim_name!r} is not an axis of the mesh, whose axes "
                f"are {list(spec.axis_names)}. Name the axis batches are split over."
            )
        if cluster is not None:
            _multi_client.check_mesh(spec, batch_dim_name, cluster.num_workers)
        rules: layouts_lib.LayoutRules | layouts_lib.AutomaticLayouts
        if layout_map is None:
            rules = layouts_lib.AutomaticLayouts(spec, batch_dim_name)
        else:
            rules = layouts_lib.LayoutRules.from_user(layout_map, spec)
        self._spec = spec
        self._batch_dim_name = batch_dim_name
        self._mesh = (
            _dtensor.make_mesh(spec) if cluster is None
            else _multi_client.make_mesh(spec, batch_dim_name, cluster)
        )
        self._cluster = cluster
        self._timeout_s = timeout
        self._input_service = None if cluster is None else data_service.ChiefInputService(
            cluster, self._input_layout(), timeout_s=_INPUT_TIMEOUT_S)
        super().__init__(
            _extended.MeshExtended(
                self, mesh=self._mesh, rules=rules, batch_dim_name=batch_dim_name,
                is_chief=cluster is None or cluster.is_chief)
        )
        self._watchdog: peer_watchdog.PeerWatchdog | None = None
        if cluster is not None:
            self._watchdog = peer_watchdog.PeerWatchdog(
                cluster, timeout_s=timeout, peer_jobs=("worker",), bound_eager_calls=True)
            self._watchdog.start()
            # Not beyond this strategy: its probes and its hook on TF's errors.
            weakref.finalize(self, self._watchdog.stop)

    @property
    def mesh(self) -> layouts_lib.MeshSpec:
        """Axis names, shape and devices of the strategy's mesh."""
        return self._spec

    @property
    def batch_dim_name(self) -> str:
        """The mesh axis batches are split over."""
        return self._batch_dim_name

    @property
    def timeout_s(self) -> float:
        """On a cluster, the bound on one step while a peer is alive but not taking part."""
        return self._timeout_s

    @property
    def cluster_config(self) -> cluster_lib.ClusterConfig | None:
        """The TF_CONFIG cluster the mesh spans, or None for one process's devices."""
        return self._cluster

    def bytes_per_device(self) -> tuple[int, int]:
        """(bytes each device holds, bytes unsplit) of the variables the scope created.

        Weights, optimizer slots and counters, metrics: what `layout_report`
        totals. Without the mesh one device would hold the second number.
        """
        held = sum(entry.bytes_per_device for entry in self.extended.created)
        whole = sum(entry.bytes_per_device * entry.slices for entry in self.extended.created)
        return held, whole

    def layout_report(self) -> str:
        """Every variable the scope created: its shape, layout, bytes per device and why.

        A markdown table, one row per variable in creation order (model
        weights, then the optimizer's slots and counters, then metrics),
        and the total bytes one device holds against what one device
        would hold without the mesh.
        """
        rows = [
            "| variable | shape | layout | bytes per device | why |",
            "|---|---|---|---|---|",
        ]
        for entry in self.extended.created:
            rows.append(
                f"| {entry.path} | {entry.shape} | {entry.axes} | {entry.bytes_per_device} | {entry.reason} |"
            )
        held, whole = self.bytes_per_device()
        mesh = " x ".join(f"{n}={s}" for n, s in zip(self._spec.axis_names, self._spec.shape))
        rows.append(f"\nMesh {mesh}: each device holds {held} bytes of variables ({whole} unsplit).")
        unused = self.extended.rules.unused()
        if unused:
            rows.append(_unused_keys_message(unused))
        return "\n".join(rows)

    # ------------------------------------------------------------------
    # Input.

    def experimental_distribute_dataset(
        self, dataset: tf.data.Dataset, options: tf.distribute.InputOptions | None = None
    ) -> Any:
        """`dataset`'s batches on the mesh, each split along `batch_dim_name`.

        Returns an iterable (not a `tf.data.Dataset`): iterate it eagerly.
        Called by Keras 3's `fit`/`evaluate`/`predict`, it also gives the
        model the strategy's step functions (module docstring).
        """
        call = keras_ps.calling_model()
        if call is not None:
            self._install_step_functions(call.model)
        if self._cluster is None:
            # Through tfdist's distributed dataset for where its passes start
            # (tfdist.elastic resumes an epoch there).
            return MeshDataset(
                dataset_lib.DistributedDataset.from_dataset(dataset), self.on_mesh,
                element_spec=dataset.element_spec,
            )
        rows = distribute.distribute_dataset(
            dataset, self._input_layout(), shard_options=None, input_options=options,
            chief_service=self._input_service)
        return MeshDataset(rows, self._on_mesh_from_rows, element_spec=dataset.element_spec)

    def _input_layout(self) -> split.InputLayout:
        """This worker's batch positions among the batch axis's (one pipeline per worker)."""
        assert self._cluster is not None and self._cluster.worker_index is not None
        return split.InputLayout(
            num_replicas_in_sync=self._spec.axis_size(self._batch_dim_name),
            num_workers=self._cluster.num_workers,
            worker_index=self._cluster.worker_index,
        )

    def _on_mesh_from_rows(self, batch: Any) -> Any:
        """This worker's rows of a global batch (tfdist's input values) onto the mesh."""
        return tf.nest.map_structure(
            lambda value: _multi_client.pack_local(value, self._mesh, self._batch_dim_name, self._spec),
            batch,
        )

    def distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
        """`dataset_fn(InputContext())` as `experimental_distribute_dataset` gives it (one pipeline)."""
        return self.experimental_distribute_dataset(dataset_fn(tf.distribute.InputContext()), options)

    def on_mesh(self, batch: Any) -> Any:
        """`batch` (a nest of tensors) on the mesh, split along `batch_dim_name` where it divides.

        A batch whose first dimension the batch axis does not divide (an
        epoch's short last batch) goes whole to every device: correct, not
        split.
        """
        size = self._spec.axis_size(self._batch_dim_name)

        def place(value: Any) -> Any:
            value = tf.convert_to_tensor(value)
            rank = value.shape.rank
            if rank and value.shape[0] is not None and value.shape[0] % size == 0:
                axes: tuple[str | None, ...] = (self._batch_dim_name,) + (None,) * (rank - 1)
            else:
                axes = (None,) * (rank or 0)
            return _dtensor.to_mesh(value, _dtensor.layout(self._mesh, axes))

        return tf.nest.map_structure(place, batch)

    # ------------------------------------------------------------------
    # Keras's loop.

    def _run_step(self, function: Any, batch: Any) -> Any:
        """`function(batch)`; on a cluster, waited for and bounded by the watchdog.

        TF's DTensor runs a step asynchronously, and its errors surface only
        where a result is read, which Keras may never do in `fit`: a lost
        worker's aborted collectives would leave the rest of the job to run
        as empty steps and `fit` to return as if it had trained.
        """
        if self._watchdog is None:
            return function(batch)

        def step_and_wait() -> Any:
            logs = function(batch)
            tf_errors.wait_for_pending_ops()
            return logs

        return self._watchdog.run_bounded(step_and_wait)

    def _install_step_functions(self, model: Any) -> None:
        if keras_ps.installed_owner(model) is self:
            return
        unused = self.extended.rules.unused()
        if unused:
            logging.warning(_unused_keys_message(unused))
        # TF's DTensor cannot lay out the fused kernel tf-keras normalizes with.
        keras_layers.unfuse_tf_keras_layer_norms(model)
        strategy = self
        run_step = self._run_step

        def compiled(step: Any) -> Any:
            function = tf.function(lambda data: strategy.run(step, args=(data,)))

            def call(data: Any) -> Any:
                try:
                    return function(data)
                except tf.errors.UnknownError as error:
                    refusal = _refusal(error, strategy)
                    if refusal is None:
                        raise
                    raise refusal from error

            return call

        train, test, predict = (
            compiled(model.train_step), compiled(model.test_step), compiled(model.predict_step),
        )

        def steps(function: Any) -> Any:
            def run(iterator: Iterator[Any]) -> Any:
                logs = None
                for index in range(keras_ps.steps_per_execution(model)):
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        if index == 0:
                            raise
                        break
                    logs = run_step(function, batch)
                return logs

            return run

        def predict_batches(data: Any) -> Any:
            # Keras 3 passes predict the list of batches it read.
            batches = data if isinstance(data, list) else [next(data)]
            outputs = [
                tf.nest.map_structure(lambda t: dtensor.unpack(_dtensor.whole(t))[0], predict(b))
                for b in batches
            ]
            if len(outputs) == 1:
                return outputs[0]
            return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *outputs)

        keras_ps.install_functions(
            model,
            self,
            train=steps(train),
            test=steps(test),
            predict=predict_batches,
            metrics_barrier=lambda: None,
        )


def _refusal(error: tf.errors.UnknownError, strategy: MeshStrategy) -> errors.LayoutError | None:
    """`error` as the `LayoutError` naming the fix, if it is one of DTensor's refusals."""
    for pattern, message in _REFUSALS:
        match = re.search(pattern, str(error))
        if match is not None:
            op = match.group(1) if match.groups() else ""
            return errors.LayoutError(message.format(
                op=op, kernels=_split_kernels(strategy), columns=_split_columns(strategy)))
    return None


def _split_columns(strategy: MeshStrategy) -> str:
    """The embedding tables split along their second dimension, for a message."""
    split = [f"{e.path} {e.axes}" for e in strategy.extended.created
             if e.path.endswith("embeddings") and len(e.shape) == 2 and e.axes[1] is not None]
    return ", ".join(split) or "none found"


def _split_kernels(strategy: MeshStrategy) -> str:
    """The split kernels of 3 or more dimensions the scope created: the convolutions' candidates."""
    return ", ".join(
        f"{entry.path} {entry.axes}"
        for entry in strategy.extended.created
        if entry.path.endswith("kernel") and len(entry.shape) >= 3 and entry.slices > 1
    ) or "none found"


def _unused_keys_message(patterns: list[str]) -> str:
    return (
        f"layout_map keys that matched no variable: {patterns}. Keys match a variable's "
        "whole path (e.g. 'sequential/d1/kernel'): start them with '.*' (e.g. '.*d1/kernel'); "
        "layouts of layer outputs ('.../output') are not applied: DTensor lays "
        "activations out itself."
    )


class MeshDataset:
    """A dataset whose batches arrive on the mesh; iterate eagerly.

    Args:
      dataset: The batched `tf.data.Dataset` (one process), or tfdist's
        distributed dataset of this worker's rows (across workers).
      on_mesh: Puts one element of `dataset` on the mesh.
      element_spec: The spec of one whole batch; `None`: `dataset`'s.
    """

    def __init__(self, dataset: Any, on_mesh: Any, element_spec: Any = None) -> None:
        self._dataset = dataset
        self._on_mesh = on_mesh
        self._element_spec = dataset.element_spec if element_spec is None else element_spec

    @property
    def element_spec(self) -> Any:
        """The spec of one whole batch."""
        return self._element_spec

    def __iter__(self) -> Iterator[Any]:
        """An iterator of the dataset, created now (not at the first batch).

        Creating it at `iter()`, as TF's distributed datasets do, makes a
        reshuffling pipeline give the same epochs as under any other
        strategy: Keras creates iterators it drops unread (the spare one of
        each epoch's end), and each creation is the next epoch's order.
        """
        iterator = iter(self._dataset)
        if tf.executing_eagerly() and isinstance(self._dataset, tf.data.Dataset):
            iterator_reaper.adopt(iterator)  # Its teardown off Keras's thread.
        return (self._on_mesh(batch) for batch in iterator)
