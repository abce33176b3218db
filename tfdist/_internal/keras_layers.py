"""Keras layers as units of placement: their weights' storage and their calls (Keras private).

Layer placement works on a model's **top-level layers** (Keras's
`model.layers`, as called by the model; a nested model or block is one
unit and everything inside it follows it). What is needed from
Keras, for Keras 3 and tf-keras alike:

- the storage of a layer's weights (`resource_variables`): Keras 3 wraps
  each `tf.Variable` in a `keras.Variable` (`._value`); tf-keras's mixed
  precision wraps it in an `AutoCastVariable` (`._variable`);
- running code around each call of a layer while a step is traced
  (`calls_wrapped`): the layer's `call` is replaced on the instance (both
  front ends' `Layer.__call__` look `self.call` up on the instance) for the
  duration of a `with` block, and restored after;
- the layers a model holds at its top level (`top_level_layers`);
- tf-keras's `LayerNormalization` made to compute without TF's fused
  batch-norm kernel (`unfuse_tf_keras_layer_norms`: the instance's
  `_fused_can_be_used` and `_fused`), which TF's DTensor cannot lay out.

`tfdist/placement/_layer_trace.py` traces a forward pass with these wrappers.

Verified against Keras 3.15 and tf-keras 2.21.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

from tfdist._internal import keras_compat

__all__ = [
    "calls_wrapped",
    "has_state_updates",
    "resource_variables",
    "storage_variable",
    "top_level_layers",
    "unfuse_tf_keras_layer_norms",
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


def unfuse_tf_keras_layer_norms(model: Any) -> int:
    """Makes the tf-keras `LayerNormalization`s in `model` compute without FusedBatchNormV3.

    tf-keras normalizes a layer's last axis with TF's fused batch-norm
    kernel where it can; it computes the same mean, variance and affine
    map with elementwise ops otherwise (its own fallback path, e.g. for
    float16 inputs on other axes). Only this model's layers change, for
    their lifetime, whether built yet or not; Keras 3 layers (which never
    fuse) are skipped. Idempotent.

    Returns:
      How many layers changed.
    """
    module = sys.modules.get("tf_keras.src.layers.normalization.layer_normalization")
    if module is None:
        return 0
    changed = 0
    for layer in [model, *model.submodules]:
        if not isinstance(layer, module.LayerNormalization) or "_fused_can_be_used" in vars(layer):
            continue
        layer._fused_can_be_used = lambda ndims: False
        if layer._fused:
            layer._fused = False
        changed += 1
    return changed


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
