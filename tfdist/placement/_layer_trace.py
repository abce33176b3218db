"""One forward pass of a model, traced layer by layer (what placement measures and cuts).

The model is traced once in a scratch `tf.function` (never run) with
recording wrappers around its top-level layers' calls
(`keras_layers.calls_wrapped`), which gives the layers in execution order,
the tensors each call consumed and produced, its name scope, and the graph
(for FLOPs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tfdist._internal import keras_layers

__all__ = ["LayerCall", "ModelTrace", "trace_calls"]


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
    layers = keras_layers.top_level_layers(model)
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

    with keras_layers.calls_wrapped(layers, record):
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
