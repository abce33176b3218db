"""Keras layers as units of placement: their calls, weights and dataflow (Keras private).

Layer placement works on a model's **top-level layers** (Keras's
`model.layers`, as called by the model; a nested model or block is one
unit and everything inside it follows it). Three things are needed from
Keras, for Keras 3 and tf-keras alike:

- the storage of a layer's weights (`resource_variables`): Keras 3 wraps
  each `tf.Variable` in a `keras.Variable` (`._value`); tf-keras's mixed
  precision wraps it in an `AutoCastVariable` (`._variable`);
- running code around each call of a layer while a step is traced
  (`calls_wrapped`): the layer's `call` is replaced on the instance (both
  front ends' `Layer.__call__` look `self.call` up on the instance) for the
  duration of a `with` block, and restored after;
- the top-level calls of one forward pass (`trace_calls`): the model is
  traced once in a scratch `tf.function` (never run) with recording
  wrappers, which gives the layers in execution order, the tensors each
  call consumed and produced, its name scope, and the graph (for FLOPs).

Verified against Keras 3.15 and tf-keras 2.21.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

from tfdist._internal import keras_compat

__all__ = [
    "LayerCall",
    "ModelTrace",
    "calls_wrapped",
    "has_state_updates",
    "resource_variables",
    "storage_variable",
    "top_level_layers",
    "trace_calls",
]

#: Wraps a layer's original `call`; returns the replacement.
CallWrapper = Callable[[Any, Callable[..., Any]], Callable[..., Any]]


def storage_variable(weight: Any) -> tf.Variable:
    """The `tf.Variable` behind a Keras weight (itself if it is one)."""
    variable = getattr(weight, "_value", None)  # Keras 3 keras.Variable.
    if variable is None:
        variable = getattr(weight, "_variable", weight)  # AutoCastVariable.
    return variable


def resource_variables(layer: Any) -> list[tf.Variable]:
    """The `tf.Variable`s behind every weight of `layer` (nested layers included).

    A weight backed by no variable has none: tf-keras's lookup layers
    (`TextVectorization`, `StringLookup`, ...) list a handler of their
    vocabulary table among their weights.
    """
    variables = (storage_variable(weight) for weight in layer.weights)
    return [v for v in variables if isinstance(v, tf.Variable)]


def has_state_updates(layer: Any) -> bool:
    """Whether calling `layer` may change its own state (non-trainable weights).

    True for BatchNormalization's moving statistics and for Keras 3 layers
    that draw random numbers (their seed generator's state is a
    non-trainable weight). Such a layer must not be run twice for one
    forward pass (rematerialization).
    """
    if layer.non_trainable_weights:
        return True
    return bool(getattr(layer, "_seed_generators", None))


def top_level_layers(model: Any) -> list[Any]:
    """The layers `model` holds directly (Keras's `model.layers`)."""
    return list(model.layers)


@contextlib.contextmanager
def calls_wrapped(layers: Sequence[Any], wrap: CallWrapper) -> Iterator[None]:
    """Inside, each layer's `call` is `wrap(layer, original_call)`.

    Set on each instance (`keras_compat.replaced_attribute`) and restored
    on exit. A layer listed twice is wrapped once.
    """
    with contextlib.ExitStack() as stack:
        seen: set[int] = set()
        for layer in layers:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            original = layer.call
            replacement = functools.wraps(original)(wrap(layer, original))
            stack.enter_context(keras_compat.replaced_attribute(layer, "call", replacement))
        yield


@dataclasses.dataclass(frozen=True)
class LayerCall:
    """The first call of one top-level layer in a traced forward pass.

    Attributes:
      layer: The layer.
      scope: The graph name scope of the call, ending in "/".
      args: The call's positional arguments, tensors as `tf.TensorSpec`.
      kwargs: Its keyword arguments, tensors as `tf.TensorSpec`.
      inputs: The input tensors of every call of the layer (graph tensors).
      outputs: The output tensors of every call of the layer.
    """

    layer: Any
    scope: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inputs: tuple[tf.Tensor, ...]
    outputs: tuple[tf.Tensor, ...]


@dataclasses.dataclass(frozen=True)
class ModelTrace:
    """One traced forward pass of a model.

    Attributes:
      calls: The top-level layers that ran, in order of their first call.
      graph: The scratch graph (ops are named under each call's scope).
      edges: `(producer, consumer, tensor)` for each tensor a later call
        consumes that derives from an earlier call's output (indices into
        `calls`): the activations that would cross a cut between them.
    """

    calls: tuple[LayerCall, ...]
    graph: Any
    edges: tuple[tuple[int, int, tf.Tensor], ...]


def _spec(value: Any) -> Any:
    if isinstance(value, tf.Tensor):
        return tf.TensorSpec(value.shape, value.dtype)
    return value


def trace_calls(model: Any, input_spec: Any) -> ModelTrace:
    """Traces `model(x, training=False)` for `x` of `input_spec`; see `ModelTrace`.

    Must run eagerly (e.g. under `tf.init_scope()`); nothing is executed
    and no state changes.

    Args:
      model: A built Keras model.
      input_spec: Nest of `tf.TensorSpec`, the model's input `x`, with a
        static batch dimension.
    """
    layers = top_level_layers(model)
    records: dict[int, dict[str, Any]] = {}
    order: list[int] = []

    def record(layer: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            outputs = original(*args, **kwargs)
            entry = records.get(id(layer))
            if entry is None:
                order.append(id(layer))
                entry = records[id(layer)] = {
                    "layer": layer,
                    "scope": tf.get_current_name_scope() + "/",
                    "args": tf.nest.map_structure(_spec, args),
                    "kwargs": tf.nest.map_structure(_spec, kwargs),
                    "inputs": [],
                    "outputs": [],
                }
            entry["inputs"] += [t for t in tf.nest.flatten((args, kwargs)) if isinstance(t, tf.Tensor)]
            entry["outputs"] += [t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)]
            return outputs

        return call

    def forward(x: Any) -> Any:
        return model(x, training=False)

    with calls_wrapped(layers, record):
        concrete = tf.function(forward, autograph=False).get_concrete_function(input_spec)
    calls = tuple(
        LayerCall(
            layer=records[key]["layer"],
            scope=records[key]["scope"],
            args=tuple(records[key]["args"]),
            kwargs=dict(records[key]["kwargs"]),
            inputs=tuple(records[key]["inputs"]),
            outputs=tuple(records[key]["outputs"]),
        )
        for key in order
    )
    return ModelTrace(calls, concrete.graph, _edges(calls))


def _edges(calls: Sequence[LayerCall]) -> tuple[tuple[int, int, tf.Tensor], ...]:
    """Which earlier calls each call's inputs derive from (see `ModelTrace`)."""
    producer: dict[Any, int] = {}
    for index, call in enumerate(calls):
        for tensor in call.outputs:
            producer.setdefault(tensor.ref(), index)
    edges = []
    for consumer, call in enumerate(calls):
        for tensor in call.inputs:
            sources = _producing_calls(tensor, producer)
            sources = {s: t for s, t in sources.items() if s < consumer}
            if not sources:
                continue
            latest = max(sources)
            edges.append((latest, consumer, tensor))  # Sent as the input itself.
            edges += [(s, consumer, t) for s, t in sources.items() if s != latest]
    return tuple(edges)


def _producing_calls(tensor: tf.Tensor, producer: dict[Any, int]) -> dict[int, tf.Tensor]:
    """Calls whose outputs `tensor` derives from (stopping at those outputs)."""
    found: dict[int, tf.Tensor] = {}
    stack, seen = [tensor], set()
    while stack:
        current = stack.pop()
        if current.ref() in seen:
            continue
        seen.add(current.ref())
        index = producer.get(current.ref())
        if index is not None:
            found.setdefault(index, current)
            continue
        stack.extend(t for t in current.op.inputs if t.dtype != tf.resource)
    return found
