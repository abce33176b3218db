"""`tfdist.LayerPlacementStrategy`: a model's layers over devices, pipelined.

Model parallelism by layers behind the standard Keras `fit`: a model's
top-level layers are cut into contiguous **stages**, one per device, and
each step's batch into **microbatches** that flow through the stages so
that the devices work at the same time (GPipe's schedule). One replica
(`num_replicas_in_sync == 1`): training equals one device with the same
global batch.

When a model is placed: at its first `fit` / `evaluate` / `predict` step
(or `strategy.place(model)` in a custom training loop):

    trace model(x) once on a microbatch's shapes     (_layer_profile)
    plan stages for its top-level layers              (tfdist.placement)
    move each layer's variables (and optimizer slots) to its stage device;
        variables of no layer (optimizer step, metrics) to the last stage
    every later traced step: each top-level layer's call is wrapped, so the
        strategy's graph device function puts its forward ops, and the
        gradient ops the tape makes for them, on the layer's device
        (_extended.py)

Until then, variables created under the scope wait on the host CPU, so a
model too large for any one accelerator can be built.

A training step with M > 1 microbatches (`_microbatch.py`):

    stage 0: F0 F1 F2 F3 .  .  .  B3 B2 B1 B0       F m: forward of microbatch m
    stage 1: .  F0 F1 F2 F3 .  B3 B2 B1 B0 .        B m: its backward
    stage 2: .  .  F0 F1 F2 F3 B3 B2 B1 B0 .  .     then one optimizer update
                                                    (gradients summed)

Each microbatch's forward and backward is its own chain of ops; TF's
executor runs any op whose inputs are ready, so stage s works on
microbatch m while stage s+1 works on m-1, as in GPipe. Each stage idles
(S - 1) / (M + S - 1) of the step (the bubble).

Pipeline x data (`data_parallel=P`): the devices form P equal groups, each
a copy of the pipeline (group p's i-th device runs what the first group's
i-th device runs). Each step's batch is cut into P x M microbatches, M per
copy, contiguous rows; each copy pipelines its own. Variables live on the
first copy's devices: the other copies read them there (a broadcast per
step), and every copy's gradients are summed on the variable's device
before the one update (a reduce), which together all-reduce each stage's
gradients among its copies. Still one replica to Keras, and still one
device's training with batch B.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ContextManager, Union

import tensorflow as tf
from absl import logging

from tfdist import devices as devices_lib
from tfdist import errors
from tfdist import placement as placement_lib
from tfdist._internal import input_values
from tfdist._internal import keras_compat
from tfdist._internal import keras_layers
from tfdist import _validation as validation
from tfdist.data import options as data_options
from tfdist.data.distributed import dataset as dataset_lib
from tfdist.data.distributed import split
from tfdist.placement import _extended as extended_lib
from tfdist.placement import _layer_profile
from tfdist.placement import _microbatch
from tfdist.data.distributed import strategy_input

__all__ = ["LayerPlacementStrategy", "PlacementFn"]

#: A callable placement: `(layers in execution order, devices) -> {layer name: device}`.
PlacementFn = Callable[
    [Sequence[placement_lib.LayerProfile], Sequence[str]], Mapping[str, str]
]
#: What `placement=` accepts.
Placement = Union[str, Mapping[str, str], PlacementFn]

#: The host CPU: where variables wait for a plan, and the input lives.
HOST_DEVICE = "/device:CPU:0"
#: Global batch rows a model is profiled with when its batch size is not
#: known at placement (Keras's default `batch_size`).
ASSUMED_BATCH_ROWS = 32


@dataclasses.dataclass
class _PlacedModel:
    """What the strategy keeps about one placed model."""

    model: weakref.ReferenceType[Any]
    name: str
    layout: _layer_profile.ModelLayout
    plan: placement_lib.PlacementPlan
    layer_devices: tuple[str, ...]
    rematerialized: tuple[int, ...]
    stage_times_s: tuple[float, ...] | None = None


class LayerPlacementStrategy(strategy_input.DistributedInputMixin, tf.distribute.Strategy):
    """Places a model's layers over devices and pipelines each step's microbatches.

    Build and compile the model under `strategy.scope()` and call `fit`,
    `evaluate` and `predict` as with any strategy (Keras 3 or tf-keras).
    The model is placed at its first step (see the module docstring);
    `placement_report()` then shows where each layer went.

    Contract: one replica (`num_replicas_in_sync == 1`); each global batch
    of B rows runs as `num_microbatches` microbatches of about B / M rows
    whose gradients are summed into one optimizer update, so training
    equals one device with batch B (float32 rounding) for any B, including
    a last partial batch. BatchNormalization normalizes over each
    microbatch in training (ghost batch norm with virtual batch B / M;
    M = 1 is exact). A custom `train_step` is run once per microbatch and
    must apply the optimizer once per call. In a custom training loop call
    `place(model)` before the first `strategy.run`. Arguments are checked
    before the TensorFlow runtime is touched, except device existence.

    Args:
      devices: Stage devices, in pipeline order; `None`: every local GPU,
        else every logical CPU (with a placement map: the devices it names).
      placement: "balanced" (contiguous stages with the smallest
        bottleneck cost, see `tfdist.placement.plan_stages`), a
        `{layer name: device}` map (unnamed layers follow the layer
        before them), or a callable `(layer profiles, devices) -> map`.
      num_microbatches: M >= 1, microbatches per step and pipeline
        (training, evaluation and prediction).
      data_parallel: P >= 1, copies of the pipeline over which each
        step's batch is split (pipeline x data parallelism; module
        docstring). `devices` (or the local devices) must number P times
        the stages of one copy: copy p is `devices[p*S:(p+1)*S]`, and a
        placement map names the first copy's devices. Applies to Keras's
        steps; a custom loop's step runs on the first copy.
      balance_by: What "balanced" equalises: "params", "flops" (forward
        FLOPs) or "measured" (each layer timed once on the first device
        at the first step).
      rematerialize: Recompute each top-level layer's activations in the
        backward pass instead of keeping them (layers with state updates,
        such as BatchNormalization or Dropout, keep theirs).
      shard_options: As for tfdist.MirroredStrategy (`None`: each global
        batch as given).

    Raises:
      ConfigError: `num_microbatches` or `data_parallel` < 1, unknown
        `placement` string or `balance_by`, an empty placement map, a
        device count `data_parallel` does not divide.
      DeviceConfigError: A device that does not exist, duplicates, or a TPU.
      TypeError: Arguments of the wrong type.
      PlacementError: (at the first step) a map naming layers the model
        lacks, more devices than layers with a map.

    Example:
      >>> strategy = tfdist.LayerPlacementStrategy(num_microbatches=4)
      >>> with strategy.scope():
      ...     model = build_model()
      ...     model.compile(optimizer="adam", loss="mse")
      >>> model.fit(dataset, epochs=3)
      >>> print(strategy.placement_report())
    """

    def __init__(
        self,
        devices: Sequence[str] | None = None,
        placement: Placement = "balanced",
        *,
        num_microbatches: int = 1,
        data_parallel: int = 1,
        balance_by: str = "params",
        rematerialize: bool = False,
        shard_options: data_options.ShardOptions | None = None,
    ) -> None:
        validation.check_positive_int("num_microbatches", num_microbatches)
        validation.check_positive_int("data_parallel", data_parallel)
        validation.check_one_of("balance_by", balance_by, placement_lib.BALANCE_BY)
        if not isinstance(rematerialize, bool):
            raise TypeError(
                "rematerialize must be True or False; received "
                f"rematerialize={rematerialize!r} of type {type(rematerialize).__name__}."
            )
        strategy_input.check_shard_options(shard_options)
        assignment = _check_placement(placement)
        if isinstance(devices, str):
            raise TypeError(
                f"devices must be a sequence of device names; received the string "
                f"devices={devices!r}. Wrap it in a list: devices=[{devices!r}]."
            )
        # The TF runtime starts here (device existence).
        if assignment is not None:
            assignment = {
                name: devices_lib.resolve_local_devices([device])[0]
                for name, device in assignment.items()
            }
        if devices is None and assignment is not None:
            if data_parallel > 1:
                raise errors.ConfigError(
                    f"data_parallel={data_parallel} with a placement map needs devices: "
                    "the map names the first pipeline's devices, and devices=[...] lists "
                    "every pipeline's, the first's first (received devices=None)."
                )
            resolved = tuple(dict.fromkeys(assignment.values()))
        else:
            resolved = devices_lib.resolve_local_devices(devices)
        if len(resolved) % data_parallel:
            raise errors.ConfigError(
                f"data_parallel={data_parallel} copies of the pipeline need a device "
                f"count it divides; received {len(resolved)} devices {list(resolved)}. "
                f"Give {data_parallel} x (stages per pipeline) devices."
            )
        tpus = [d for d in resolved if tf.DeviceSpec.from_string(d).device_type == "TPU"]
        if tpus:
            raise errors.DeviceConfigError(  # tpu: XLA compiles a TPU step whole.
                f"devices {tpus} are TPUs; LayerPlacementStrategy places TF ops on "
                "devices op by op, which TPUs do not run (a TPU step is compiled "
                "whole by XLA). Use tf.distribute.TPUStrategy, or GPU/CPU devices."
            )
        self._explicit_devices = devices is not None
        self._assignment = assignment
        self._placement = placement
        self._num_microbatches = num_microbatches
        self._data_parallel = data_parallel
        stages = len(resolved) // data_parallel
        self._pipelines = tuple(
            tuple(resolved[p * stages:(p + 1) * stages]) for p in range(data_parallel)
        )
        self._balance_by = balance_by
        self._rematerialize = rematerialize
        self._shard_options = shard_options
        self._placed: dict[int, _PlacedModel] = {}
        self._latest: _PlacedModel | None = None
        extended = extended_lib.PlacementExtended(
            self,
            pipelines=self._pipelines,
            host_device=HOST_DEVICE,
            replica_scope=self._layers_placed,
        )
        tf.distribute.Strategy.__init__(self, extended)
        self._devices = tuple(resolved)

    # ------------------------------------------------------------------
    # Public API.

    @property
    def devices(self) -> tuple[str, ...]:
        """Candidate stage devices in order, canonical (``/device:GPU:0``); every pipeline's."""
        return self._devices

    @property
    def pipelines(self) -> tuple[tuple[str, ...], ...]:
        """The copies of the pipeline (`data_parallel` of them), each its stage devices."""
        return self._pipelines

    @property
    def num_microbatches(self) -> int:
        """Microbatches per step and pipeline (M)."""
        return self._num_microbatches

    @property
    def data_parallel(self) -> int:
        """Copies of the pipeline each step's batch is split over (P)."""
        return self._data_parallel

    @property
    def balance_by(self) -> str:
        return self._balance_by

    @property
    def rematerialize(self) -> bool:
        return self._rematerialize

    @property
    def shard_options(self) -> data_options.ShardOptions | None:
        """How plain datasets are sharded (`None`: each batch as given)."""
        return self._shard_options

    def placement_plan(self, model: Any = None) -> placement_lib.PlacementPlan:
        """The stages of `model` (default: the model placed last).

        Raises:
          PlacementError: If that model has not been placed yet.
        """
        return self._placed_model(model).plan

    def place(self, model: Any, x: Any = None) -> placement_lib.PlacementPlan:
        """Plans `model` and moves its variables to their stage devices now.

        `fit`, `evaluate` and `predict` do this at their first step; a
        custom training loop calls it once, after building the model and
        before the first `strategy.run`. Placing a placed model again does
        nothing. Must be called eagerly.

        Args:
          model: A built Keras model created under this strategy's scope.
          x: A batch of the model's input (a nest of tensors or arrays),
            or a nest of `tf.TensorSpec`; `None`: the model's `inputs`
            (functional and Sequential models). Its batch size is the one
            the layers are profiled (and with `balance_by="measured"`
            timed) on; `ASSUMED_BATCH_ROWS` where it is not static.

        Returns:
          The plan.

        Raises:
          PlacementError: If the model has no known input and `x` is None,
            or the placement does not fit the model.
        """
        if x is None:
            inputs = getattr(model, "inputs", None)
            if not inputs:
                raise errors.PlacementError(
                    f"model {model.name!r} declares no inputs (a subclassed model), "
                    "so its shapes are unknown; received x=None. Pass a batch: "
                    "strategy.place(model, x=next(iter(dataset))[0])."
                )
            x = tf.nest.map_structure(
                lambda t: tf.TensorSpec(t.shape, t.dtype), inputs[0] if len(inputs) == 1 else inputs
            )
        return self._ensure_placed(model, x, None).plan

    def placement_report(self, model: Any = None) -> placement_lib.PlacementReport:
        """Where `model`'s layers are (default: the model placed last), with measured stage times.

        The first call times each stage's layers (forward and backward on
        one microbatch) on its device; later calls reuse the times. Must be
        called eagerly, outside a step.

        Raises:
          PlacementError: If no model has been placed yet.
        """
        placed = self._placed_model(model)
        if placed.stage_times_s is None:
            times = [0.0] * placed.plan.num_stages
            for stage in placed.plan.stages:
                for index in stage.layer_indices:
                    times[stage.index] += _layer_profile.time_layer(
                        placed.layout.calls[index], stage.device
                    )
            placed.stage_times_s = tuple(times)
        return placement_lib.PlacementReport(
            model_name=placed.name,
            plan=placed.plan,
            num_microbatches=self._num_microbatches,
            pipelines=self._pipelines,
            microbatch_rows=placed.layout.microbatch_rows,
            stage_times_s=placed.stage_times_s,
            rematerialized=tuple(
                placed.layout.calls[i].layer.name for i in placed.rematerialized
            ),
        )

    # ------------------------------------------------------------------
    # tf.distribute.Strategy.

    def run(
        self,
        fn: Any,
        args: Any = (),
        kwargs: Any = None,
        options: tf.distribute.RunOptions | None = None,
    ) -> Any:
        """`tf.distribute.Strategy.run` on the one replica, placed and microbatched.

        For a step of Keras's `fit`, `evaluate` or `predict`: the model is
        placed at its first step, and with `num_microbatches` > 1 the step
        runs once per microbatch (module docstring). Any other `fn` (a
        custom loop's step) runs once on the whole batch, with the placed
        models' layers on their devices.

        Raises:
          PlacementError: For a custom loop's step when no model was placed
            (call `place(model)` first), or see `place`.
        """
        step = keras_compat.keras_step(fn)
        if step is None:
            if not self._placed and self.extended.created_variables():
                raise errors.PlacementError(
                    "strategy.run was given a step that is not Keras's own "
                    f"({getattr(fn, '__qualname__', fn)!r}), and no model has "
                    "been placed: the variables created under the scope are "
                    "still waiting on the host. In a custom training loop call "
                    "strategy.place(model) once, after building the model and "
                    "before the first strategy.run."
                )
            return tf.distribute.Strategy.run(self, fn, args, kwargs, options)
        args = tuple(args)
        self._ensure_placed(step.model, *_model_input(args))
        if self._total_microbatches == 1 or kwargs or len(args) != 1:
            return tf.distribute.Strategy.run(self, fn, args, kwargs, options)
        microbatched_step = functools.partial(
            _microbatch.MicrobatchedStep,
            keras_step=step,
            num_microbatches=self._total_microbatches,
            num_pipelines=self._data_parallel,
            on_pipeline=self.extended.on_pipeline,
        )
        if keras_compat.is_bound_step(fn, step):
            return tf.distribute.Strategy.run(self, microbatched_step(fn), args, None, options)
        microbatched = microbatched_step(getattr(step.model, f"{step.kind}_step"))
        with keras_compat.step_replaced(step, microbatched):
            return tf.distribute.Strategy.run(self, fn, args, None, options)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """TF's `Strategy.scope`; inside it, tf-keras's `LossScaleOptimizer` works.

        tf-keras accepts loss scaling only under the strategies it lists; this
        one has one replica and one copy of each variable, which is what it
        requires (`keras_compat.loss_scaling_allowed`, undone on exit).
        """
        with super().scope(), keras_compat.loss_scaling_allowed(type(self)):
            yield

    def distribute_datasets_from_function(
        self, dataset_fn: Any, options: tf.distribute.InputOptions | None = None
    ) -> tf.distribute.DistributedDataset:
        """TF's `distribute_datasets_from_function` for the one replica.

        `dataset_fn` is called once with a `tf.distribute.InputContext` of
        one pipeline and one replica; its batches feed the replica whole.
        """
        del options  # One pipeline on the host: nothing to choose.
        dataset = dataset_fn(tf.distribute.InputContext())
        return dataset_lib.DistributedDataset.from_dataset(dataset)

    def _input_layout(self) -> split.InputLayout:
        return split.InputLayout(num_replicas_in_sync=1, num_workers=1, worker_index=0)

    # ------------------------------------------------------------------
    # Placement.

    @property
    def _total_microbatches(self) -> int:
        """Microbatches of one step over every pipeline."""
        return self._num_microbatches * self._data_parallel

    def _placed_model(self, model: Any) -> _PlacedModel:
        placed = self._latest if model is None else self._placed.get(id(model))
        if placed is None or placed.model() is None:
            raise errors.PlacementError(
                "no model has been placed by this strategy yet"
                + ("" if model is None else f" (received model={model.name!r})")
                + ". Models are placed at their first fit/evaluate/predict "
                "step, or by strategy.place(model)."
            )
        return placed

    def _ensure_placed(self, model: Any, x: Any, batch_size: int | None) -> _PlacedModel:
        """Places `model` unless it is; `x` is a batch or specs of its input."""
        placed = self._placed.get(id(model))
        if placed is not None and placed.model() is model:
            return placed
        rows = batch_size or _static_rows(x)
        if rows is None:
            rows = ASSUMED_BATCH_ROWS
            logging.info(
                "tfdist: the batch size of model %r is not known when it is placed "
                "(e.g. a generator without static shapes); its layers are profiled on batches of "
                "%d rows. To profile (and, with balance_by='measured', time) them on "
                "your own batch, call strategy.place(model, x=a_batch) before fit.",
                model.name, rows,
            )
        with tf.init_scope():
            placed = self._plan_and_move(model, x, rows)
        self._placed[id(model)] = self._latest = placed
        logging.info("tfdist: placed model %r:\n%s", placed.name, _summary(placed))
        return placed

    def _plan_and_move(self, model: Any, x: Any, batch_size: int) -> _PlacedModel:
        rows = max(1, math.ceil(batch_size / self._total_microbatches))
        x_spec = tf.nest.map_structure(lambda t: _microbatch_spec(t, rows), x)
        layout = _layer_profile.profile_model(model, x_spec, microbatch_rows=rows)
        extended = self.extended
        if self._balance_by == "measured":
            times = []
            for call in layout.calls:
                variables = keras_layers.resource_variables(call.layer)
                for variable in variables:
                    extended.move(variable, self._pipelines[0][0])
                times.append(_layer_profile.time_layer(call, self._pipelines[0][0]))
                for variable in variables:
                    extended.move(variable, HOST_DEVICE)
            layout = _layer_profile.with_times(layout, times)
        plan = self._plan(layout.graph)
        layer_devices = plan.layer_devices()
        moved: set[int] = set()
        for call, device in zip(layout.calls, layer_devices):
            for variable in keras_layers.resource_variables(call.layer):
                if id(variable) not in moved:  # Shared: the first user's stage.
                    moved.add(id(variable))
                    extended.move(variable, device)
        last = plan.stages[-1].device
        for variable in extended.created_variables():
            if id(variable) not in moved and extended.is_on_host(variable):
                extended.move(variable, last)  # Optimizer step, metrics, unused layers.
        extended.set_default_variable_device(last)
        rematerialized = tuple(
            index
            for index, call in enumerate(layout.calls)
            if self._rematerialize and not keras_layers.has_state_updates(call.layer)
        )
        return _PlacedModel(
            model=weakref.ref(model),
            name=model.name,
            layout=layout,
            plan=plan,
            layer_devices=layer_devices,
            rematerialized=rematerialized,
        )

    def _plan(self, graph: placement_lib.LayerGraph) -> placement_lib.PlacementPlan:
        devices = self._pipelines[0]  # The others copy it.
        stage_devices = devices if self._explicit_devices else None
        if self._assignment is not None:
            return placement_lib.plan_from_assignment(
                graph, self._assignment, devices=stage_devices, balance_by=self._balance_by
            )
        if callable(self._placement):
            chosen = self._placement(graph.layers, devices)
            if not isinstance(chosen, Mapping):
                raise TypeError(
                    "a placement callable must return a {layer name: device} "
                    f"mapping; received {chosen!r} of type {type(chosen).__name__}."
                )
            assignment = {
                name: devices_lib.resolve_local_devices([device])[0]
                for name, device in _check_assignment(chosen, "the placement callable's result").items()
            }
            return placement_lib.plan_from_assignment(
                graph, assignment, devices=stage_devices, balance_by=self._balance_by
            )
        return placement_lib.plan_stages(graph, devices, balance_by=self._balance_by)

    @contextlib.contextmanager
    def _layers_placed(self) -> Iterator[None]:
        """Around every replica step: each placed layer's calls run on its device."""
        layers, wraps = [], {}
        for placed in self._placed.values():
            if placed.model() is None:
                continue
            for index, (call, device) in enumerate(zip(placed.layout.calls, placed.layer_devices)):
                layers.append(call.layer)
                wraps[id(call.layer)] = (device, index in placed.rematerialized)
        extended = self.extended

        def wrap(layer: Any, original: Callable[..., Any]) -> Callable[..., Any]:
            device, rematerialize = wraps[id(layer)]

            def call(*args: Any, **kwargs: Any) -> Any:
                if rematerialize and not tf.executing_eagerly():
                    return _recomputed(
                        original, args, kwargs,
                        lambda: extended.enter_layer_call(extended.pipeline_device(device)),
                    )
                with extended.enter_layer_call(extended.pipeline_device(device)):
                    return original(*args, **kwargs)

            return call

        with keras_layers.calls_wrapped(layers, wrap):
            yield


def _recomputed(
    original: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    layer_call: Callable[[], ContextManager[None]],
) -> Any:
    """`original(*args, **kwargs)`, its activations recomputed in the backward pass.

    TF recomputes the forward pass inside the gradient function, outside
    the layer's call scope; each run opens its own name scope and enters
    `layer_call()` there, so the recomputed ops and their gradients are
    placed like the first forward pass.
    """
    flat = tf.nest.flatten(args)
    positions = [i for i, v in enumerate(flat) if isinstance(v, tf.Tensor)]

    def forward(*tensors: tf.Tensor) -> Any:
        filled = list(flat)
        for position, tensor in zip(positions, tensors):
            filled[position] = tensor
        with tf.name_scope("rematerialized"), layer_call():
            return original(*tf.nest.pack_sequence_as(args, filled), **kwargs)

    return tf.recompute_grad(forward)(*[flat[i] for i in positions])


def _check_placement(placement: object) -> dict[str, str] | None:
    """Validates `placement=`; returns the map, or None for "balanced" / a callable."""
    if isinstance(placement, str):
        validation.check_one_of("placement", placement, ("balanced",))
        return None
    if isinstance(placement, Mapping):
        return _check_assignment(placement, "placement")
    if callable(placement):
        return None
    raise TypeError(
        "placement must be 'balanced', a {layer name: device} mapping or a "
        f"callable; received placement={placement!r} of type {type(placement).__name__}."
    )


def _check_assignment(assignment: Mapping[Any, Any], what: str) -> dict[str, str]:
    if not assignment:
        raise errors.ConfigError(
            f"{what}={{}} names no layer. Map layer names to devices, e.g. "
            "{'dense': '/gpu:0', 'dense_1': '/gpu:1'}, or use placement='balanced'."
        )
    for name, device in assignment.items():
        if not isinstance(name, str) or not isinstance(device, str):
            raise TypeError(
                f"{what} must map layer names (str) to device names (str); "
                f"received {name!r}: {device!r}."
            )
    return dict(assignment)


def _model_input(args: tuple[Any, ...]) -> tuple[Any, int | None]:
    """`(x, global batch size if known)` of a Keras step's `(data,)`."""
    nominal = None
    for leaf in tf.nest.flatten(args[0]):
        if input_values.is_input_value(leaf):
            nominal = nominal or leaf.nominal_batch_size
    data = tf.nest.map_structure(
        lambda v: v.values[0] if input_values.is_input_value(v) else v, args[0]
    )
    x, _, _ = tf.keras.utils.unpack_x_y_sample_weight(data)
    return x, nominal


def _static_rows(x: Any) -> int | None:
    """The batch rows of `x` if static, else None."""
    for leaf in tf.nest.flatten(x):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return None


def _microbatch_spec(value: Any, rows: int) -> tf.TensorSpec:
    """The spec of one microbatch of `rows` rows of `value` (a batch or a spec)."""
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        value = tf.convert_to_tensor(value)
    return tf.TensorSpec([rows] + list(value.shape)[1:], tf.as_dtype(value.dtype))


def _summary(placed: _PlacedModel) -> str:
    return "\n".join(
        f"  stage {stage.index} on {stage.device}: {', '.join(stage.layers)}"
        for stage in placed.plan.stages
    )
