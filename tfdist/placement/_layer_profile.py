"""Measures a Keras model for the planner: layers in order, their costs, the bytes between them.

    profile_model(model, x_spec):
        trace model(x) once, never run (`_layer_trace.trace_calls`)
        per top-level layer that ran, in order of its first call:
            params, param bytes     <- its weights
            flops                   <- TF's registered per-op FLOPs in its
                                       call's name scope (forward)
        per activation a later layer consumes from an earlier one:
            bytes                   <- static shape x dtype size
    time_layer(call, device):       (balance_by="measured", and the report)
        forward + backward of the layer alone on random inputs of its traced
        shapes, on `device`; the fastest of a few runs

Every number is per microbatch (the traced batch has a microbatch's rows).
Timing runs the layer with `training=False`, so no state changes (moving
statistics, random seeds).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import tensorflow as tf

from tfdist import placement
from tfdist._internal import keras_layers
from tfdist._internal import op_stats
from tfdist.placement import _layer_trace

__all__ = ["ModelLayout", "profile_model", "time_layer"]

#: Timed runs per layer after one warm-up run; the fastest counts.
TIMING_REPEATS = 3


@dataclasses.dataclass(frozen=True)
class ModelLayout:
    """A model's top-level layers as the planner sees them.

    Attributes:
      calls: The layers that ran, in order of their first call (plan
        indices are positions here).
      graph: Their profiles and the activations between them.
      unused_layers: Top-level layers the traced forward pass did not call.
      microbatch_rows: Rows of the traced batch (numbers are per this many).
    """

    calls: tuple[_layer_trace.LayerCall, ...]
    graph: placement.LayerGraph
    unused_layers: tuple[Any, ...]
    microbatch_rows: int


def profile_model(model: Any, x_spec: Any, *, microbatch_rows: int) -> ModelLayout:
    """Traces `model` on `x_spec` and profiles its top-level layers (module docstring).

    Must run eagerly (or under `tf.init_scope()`).
    """
    trace = _layer_trace.trace_calls(model, x_spec)
    flops = op_stats.flops_by_scope(trace.graph, [call.scope for call in trace.calls])
    layers = []
    for call, layer_flops in zip(trace.calls, flops):
        variables = keras_layers.resource_variables(call.layer)
        layers.append(
            placement.LayerProfile(
                name=call.layer.name,
                params=sum(v.shape.num_elements() or 0 for v in variables),
                param_bytes=sum(_num_bytes(v.shape, v.dtype) for v in variables),
                flops=layer_flops,
            )
        )
    edges = tuple(
        placement.ActivationEdge(producer, consumer, _num_bytes(tensor.shape, tensor.dtype))
        for producer, consumer, tensor in trace.edges
    )
    called = {id(call.layer) for call in trace.calls}
    return ModelLayout(
        calls=trace.calls,
        graph=placement.LayerGraph(tuple(layers), edges),
        unused_layers=tuple(
            layer for layer in keras_layers.top_level_layers(model) if id(layer) not in called
        ),
        microbatch_rows=microbatch_rows,
    )


def with_times(layout: ModelLayout, times_s: list[float]) -> ModelLayout:
    """`layout` with every layer's `measured_s` set."""
    layers = tuple(
        dataclasses.replace(profile, measured_s=seconds)
        for profile, seconds in zip(layout.graph.layers, times_s)
    )
    return dataclasses.replace(
        layout, graph=placement.LayerGraph(layers, layout.graph.edges)
    )


def time_layer(call: _layer_trace.LayerCall, device: str) -> float:
    """Seconds of one forward and backward pass of `call.layer` on `device`.

    Random inputs of the traced shapes (integers and booleans: zeros);
    gradients with respect to its trainable weights and floating inputs.
    """
    layer = call.layer
    flat_specs = tf.nest.flatten((call.args, call.kwargs))
    kwargs_training = dict(call.kwargs)
    if "training" in kwargs_training:
        kwargs_training["training"] = False

    def make(spec: Any) -> Any:
        if not isinstance(spec, tf.TensorSpec):
            return spec
        shape = [1 if d is None else d for d in spec.shape]
        if spec.dtype.is_floating:
            return tf.random.normal(shape, dtype=spec.dtype)
        return tf.zeros(shape, spec.dtype)

    with tf.device(device):
        values = [make(s) for s in flat_specs]
    tensors = [v for v in values if isinstance(v, tf.Tensor)]

    def run(*inputs: tf.Tensor) -> tf.Tensor:
        feed = iter(inputs)
        filled = [next(feed) if isinstance(v, tf.Tensor) else v for v in values]
        args, kwargs = tf.nest.pack_sequence_as((call.args, kwargs_training), filled)
        watched = [t for t in inputs if t.dtype.is_floating]
        with tf.device(device), tf.GradientTape() as tape:
            tape.watch(watched)
            outputs = layer(*args, **kwargs)
            total = tf.add_n(
                [tf.reduce_sum(tf.cast(o, tf.float32)) for o in tf.nest.flatten(outputs)
                 if isinstance(o, tf.Tensor) and o.dtype.is_floating]
                or [tf.constant(0.0)]
            )
        gradients = tape.gradient(total, list(layer.trainable_weights) + watched)
        return tf.add_n([total] + [tf.reduce_sum(tf.cast(g, tf.float32)) for g in gradients
                                   if isinstance(g, tf.Tensor)])

    function = tf.function(run, autograph=False)
    function(*tensors).numpy()  # Traces and warms up.
    best = float("inf")
    for _ in range(TIMING_REPEATS):
        start = time.perf_counter()
        function(*tensors).numpy()
        best = min(best, time.perf_counter() - start)
    return best


def _num_bytes(shape: tf.TensorShape, dtype: tf.DType) -> int:
    count = shape.num_elements()
    return 0 if count is None else count * tf.as_dtype(dtype).size
