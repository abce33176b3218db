"""The `StrategyExtended` behind `tfdist.LayerPlacementStrategy`.

One replica whose layers live on several devices. TF's strategy contract
for one replica (its private underscore hooks) is
`_internal.single_replica.SingleReplicaExtended`; this class decides, through
that class's public hooks, where variables and ops go.

Variables. Every variable created under the strategy's scope is created on
the host (`host_device`) until a plan says where it goes, then moved there
by `move` (`variables.move_variable`: same Python object, new device); a
variable created with `colocate_with` (an optimizer slot) is created next
to that variable and moves with it.

Ops. A graph device function keyed on what is being traced places every
op of a replica step that has no device of its own (with several
pipelines, "a layer's device" is its stage's device in the pipeline whose
microbatch is being traced, `on_pipeline`):

    op created while a placed layer's call runs (forward) -> that layer's device
    op named "gradient_tape/<scope>/..." where <scope> is a recorded call
        scope of a placed layer (its backward)            -> that layer's device
    op reading a resource (a variable)                    -> left to TF, which
                                                             colocates it with
                                                             the variable
    any other op -> the device of its inputs: the latest stage among them for
        a forward op (loss, metrics: where the logits are), the earliest for
        a backward op (the gradient of an op between two layers runs where
        that op ran); with no placed input, the last layer's device

Ops do not follow their variables by themselves: a `tf.device` around a
layer's call places its forward ops but not the gradients the tape creates
(they land on the default device), which is why the backward ops are
matched by name scope. Layer calls are recorded by the strategy's wrappers
(`enter_layer_call`) while a step is traced.

Pipelines (pipeline x data parallelism). The stages can be copied over
several equal device groups, `pipelines[d][i]` holding what
`pipelines[0][i]` holds. Variables live on the first pipeline's devices
only; ops traced under `on_pipeline(d)` run on pipeline d's devices, so TF
copies each variable read there (a broadcast per step) and the gradients
come back to the variable's device to be summed before the one update (a
reduce): together an all-reduce among each stage's copies.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ContextManager

import tensorflow as tf

from tfdist._internal import single_replica
from tfdist._internal import variables as variables_lib

__all__ = ["PlacementExtended"]

#: Prefix of the ops `tf.GradientTape` creates for a forward op's gradient.
_BACKWARD_PREFIX = "gradient_tape/"


def _short(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' -> '/device:CPU:1'."""
    return "/device:" + device.rsplit("/device:", 1)[-1] if "/device:" in device else device


class PlacementExtended(single_replica.SingleReplicaExtended):  # type: ignore[misc]
    """One replica spread over `devices` by layer; see the module docstring.

    Args:
      container_strategy: The `tf.distribute.Strategy` this extends.
      pipelines: Canonical stage device names ("/device:CPU:1") in
        pipeline order, one tuple per copy of the pipeline, all of one
        length; variables live on the first.
      host_device: Where variables wait for a plan, and the input lives.
      replica_scope: Returns the context entered around every replica step
        (the strategy installs its layer-call wrappers there).
    """

    def __init__(
        self,
        container_strategy: tf.distribute.Strategy,
        *,
        pipelines: tuple[tuple[str, ...], ...],
        host_device: str,
        replica_scope: Callable[[], ContextManager[None]],
    ) -> None:
        super().__init__(container_strategy)
        self._pipelines = pipelines
        self._devices = pipelines[0]
        # Each device's position in its pipeline.
        self._stage_of = {
            device: index for devices in pipelines for index, device in enumerate(devices)
        }
        self._host_device = host_device
        self._default_device = host_device
        self._replica_scope = replica_scope
        self._created: list[weakref.ReferenceType[tf.Variable]] = []
        self._colocated: dict[int, list[weakref.ReferenceType[tf.Variable]]] = {}
        self._call_scopes: weakref.WeakKeyDictionary[Any, dict[str, str]] = (
            weakref.WeakKeyDictionary()
        )
        self._active = threading.local()

    # ------------------------------------------------------------------
    # Variables.

    def create_variable(self, next_creator: Any, **kwargs: Any) -> Any:
        colocate_with = kwargs.pop("colocate_with", None)
        device = self._default_device if colocate_with is None else colocate_with.device
        with tf.device(device):
            variable = next_creator(**kwargs)
        reference = weakref.ref(variable)
        self._created.append(reference)
        if colocate_with is not None:
            self._colocated.setdefault(id(colocate_with), []).append(reference)
        return variable

    def created_variables(self) -> list[tf.Variable]:
        """Variables created under the scope that still exist, oldest first."""
        alive = [v for v in (r() for r in self._created) if v is not None]
        self._created = [weakref.ref(v) for v in alive]
        return alive

    def is_on_host(self, variable: tf.Variable) -> bool:
        """Whether `variable` still waits on the host for a plan."""
        return _short(variable.device) == _short(self._host_device)

    def move(self, variable: tf.Variable, device: str) -> None:
        """Moves `variable`, and the variables colocated with it, to `device`."""
        if not variables_lib.is_resource_variable(variable):
            return
        variables_lib.move_variable(variable, device)
        for reference in self._colocated.get(id(variable), ()):
            dependent = reference()
            if dependent is not None:
                variables_lib.move_variable(dependent, device)

    def set_default_variable_device(self, device: str) -> None:
        """Where variables created later without `colocate_with` go."""
        self._default_device = device

    # ------------------------------------------------------------------
    # Op placement.

    @contextlib.contextmanager
    def enter_layer_call(self, device: str) -> Iterator[None]:
        """Marks a placed layer's call: its ops, forward and backward, go to `device`."""
        if not tf.executing_eagerly():
            graph = tf.compat.v1.get_default_graph()
            scopes = self._call_scopes.setdefault(graph, {})
            scopes[tf.get_current_name_scope() + "/"] = device
        stack = self._active_stack()
        stack.append(device)
        self._active.last = device
        try:
            with tf.device(device):
                yield
        finally:
            stack.pop()

    @contextlib.contextmanager
    def on_pipeline(self, index: int) -> Iterator[None]:
        """Ops traced inside go to pipeline `index`'s copy of each stage.

        Entered by the microbatch loop around each microbatch's step (and
        around the one update, on pipeline 0). Thread-local; nests.
        """
        previous = self._pipeline_index()
        self._active.pipeline = index
        try:
            yield
        finally:
            self._active.pipeline = previous

    def _pipeline_index(self) -> int:
        return getattr(self._active, "pipeline", 0)  # type: ignore[no-any-return]

    def pipeline_device(self, device: str) -> str:
        """The current pipeline's copy of the first pipeline's `device`."""
        position = self._stage_of.get(_short(device))
        if position is None:
            return device
        return self._pipelines[self._pipeline_index()][position]

    def _active_stack(self) -> list[str]:
        if not hasattr(self._active, "stack"):
            self._active.stack = []
        return self._active.stack  # type: ignore[no-any-return]

    def _op_device(self, op: tf.Operation) -> str:
        """The graph device function (module docstring)."""
        if op.device:
            return op.device  # An explicit tf.device wins.
        stack = self._active_stack()
        if stack:
            return stack[-1]
        backward = op.name.startswith(_BACKWARD_PREFIX) or (
            "/" + _BACKWARD_PREFIX in op.name
        )
        if backward:
            scopes = self._call_scopes.get(op.graph, {})
            name = op.name.split(_BACKWARD_PREFIX, 1)[1]
            parts = name.split("/")
            for end in range(1, len(parts)):
                device = scopes.get("/".join(parts[:end]) + "/")
                if device is not None:
                    return device
        stages = []
        for tensor in op.inputs:
            if tensor.dtype == tf.resource:
                return ""  # TF colocates it with the variable.
            stage = self._stage_of.get(_short(tensor.op.device))
            if stage is not None:
                stages.append(stage)
        if stages:
            devices = self._pipelines[self._pipeline_index()]
            return devices[min(stages) if backward else max(stages)]
        return getattr(self._active, "last", "")

    # ------------------------------------------------------------------
    # The replica step.

    @contextlib.contextmanager
    def replica_step(self) -> Iterator[None]:
        """The strategy's replica scope, with the graph device function while tracing."""
        if tf.executing_eagerly():
            device_functions: ContextManager[Any] = contextlib.nullcontext()
        else:
            device_functions = tf.compat.v1.get_default_graph().device(self._op_device)
        with self._replica_scope(), device_functions:
            yield

    @property
    def worker_devices(self) -> tuple[str, ...]:
        # The one replica's input lives on the host.
        return (self._host_device,)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return self._devices
