"""tf-keras sees each variable split over ps tasks whole, in weights and weight files (tf-keras private).

tf-keras's `add_weight` lists a `ShardedVariable`'s shards among the
layer's weights, one by one (its optimizers train shards). So a split
`Embedding` table comes out of `get_weights()` as one array per shard,
`set_weights` wants it so, and a weights file holds shards: what a model on
one device (or split otherwise) neither gives nor loads. Keras 3 lists the
variable whole. `install()` (by `tfdist.ParameterServerStrategy` when it
splits variables, under tf-keras) wraps the places that read a layer's
weights as values, so that wherever a layer's weights hold every shard of
one split variable, in order, they stand for it as one:

- `Layer.get_weights` joins the shards' arrays (rows in shard order);
- `Layer.set_weights` takes one array and assigns each shard its rows (a
  list of the shards' arrays, as tf-keras took it, is still taken);
- `Layer.save_own_variables` / `load_own_variables` (tf-keras's `.keras`
  and `.weights.h5` files) store one entry for it;
- `hdf5_format._legacy_weights` (tf-keras's legacy `.h5` weights) lists
  the `ShardedVariable` itself, which reads and assigns as a whole.

Training is untouched: `trainable_weights` still lists shards. A
checkpoint in TF's format was whole already (a split variable saves as
slices of one key).

Private tf-keras API used (tested range: setup.py): `Layer.get_weights`,
`set_weights`, `save_own_variables`, `load_own_variables`,
`saving.legacy.hdf5_format._legacy_weights`; private TF: a shard's
`_sharded_container` (the weak reference TF sets to its `ShardedVariable`).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tfdist import errors

__all__ = ["install", "legacy_keras", "whole"]

_BASE_LAYER = "tf_keras.src.engine.base_layer"

_INSTALL_LOCK = threading.Lock()
_installed = False


def _container(weight: Any) -> Any:
    """The `ShardedVariable` `weight` is a shard of, or None."""
    reference = getattr(weight, "_sharded_container", None)
    return reference() if callable(reference) else None


def _grouped(weights: list[Any]) -> list[tuple[Any, bool]]:
    """(entry, whether it is a split variable) per entry of `whole(weights)`."""
    found: list[tuple[Any, bool]] = []
    index = 0
    while index < len(weights):
        container = _container(weights[index])
        if container is not None:
            shards = list(container.variables)
            run = weights[index : index + len(shards)]
            if len(run) == len(shards) and all(a is b for a, b in zip(run, shards)):
                found.append((container, True))
                index += len(shards)
                continue
        found.append((weights[index], False))
        index += 1
    return found


def whole(weights: list[Any]) -> list[Any]:
    """`weights` with every complete, in-order run of one split variable's shards replaced by it."""
    return [entry for entry, _ in _grouped(weights)]


def _entries(weights: list[Any]) -> Iterator[tuple[int, Any]]:
    """Per entry of `whole(weights)`: how many of tf-keras's values it covers, and its split variable or None."""
    for entry, split in _grouped(weights):
        if split:
            yield len(entry.variables), entry
        else:
            # A tf-keras `TrackableWeightHandler` (a lookup layer's vocabulary) gives several.
            yield int(getattr(entry, "num_tensors", 1)), None


def _has_shards(weights: list[Any]) -> bool:
    return any(_container(w) is not None for w in weights)


def _joined(weights: list[Any], arrays: list[Any]) -> list[Any]:
    """tf-keras's value list for `weights` with each split variable's arrays joined."""
    joined: list[Any] = []
    start = 0
    for width, split in _entries(weights):
        part = arrays[start : start + width]
        start += width
        if split is None:
            joined.extend(part)
        else:
            joined.append(np.concatenate(part, axis=0))
    return joined


def _whole_count(weights: list[Any]) -> int:
    """How many values `get_weights` returns for `weights` (each split variable one)."""
    return sum(1 if split is not None else width for width, split in _entries(weights))


def _split(layer: Any, weights: list[Any], values: list[Any]) -> list[Any]:
    """`values` (as `get_weights` returns them) as tf-keras's list: each split variable's rows per shard."""
    split_values: list[Any] = []
    start = 0
    for width, split in _entries(weights):
        if split is None:
            split_values.extend(values[start : start + width])
            start += width
            continue
        array = np.asarray(values[start])
        start += 1
        expected = tuple(split.shape)
        if array.shape != expected:
            raise errors.ConfigError(
                f"set_weights on layer {layer.name!r}: the value for {split.name!r} "
                f"(split over {len(split.variables)} ps tasks) has shape {array.shape}, "
                f"but the variable's whole shape is {expected}. Pass the whole variable's "
                "value, as get_weights() returns it."
            )
        bounds = np.cumsum([int(shard.shape[0]) for shard in split.variables])[:-1]
        split_values.extend(np.split(array, bounds, axis=0))
    return split_values


def _wrap_get_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_weights(self: Any) -> Any:
        arrays = original(self)
        weights = self.weights
        return _joined(weights, arrays) if _has_shards(weights) else arrays

    return get_weights


def _wrap_set_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_weights(self: Any, weights: Any) -> Any:
        params = self.weights
        values = list(weights)
        if _has_shards(params) and len(values) == _whole_count(params):
            values = _split(self, params, values)
        return original(self, values)

    return set_weights


def _own_variables(layer: Any) -> list[Any]:
    """The variables tf-keras's `save_own_variables`/`load_own_variables` list, in their order."""
    return layer._trainable_weights + layer._non_trainable_weights


def _wrap_save_own_variables(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_own_variables(self: Any, store: Any) -> Any:
        variables = _own_variables(self)
        if not _has_shards(variables):
            return original(self, store)
        for index, variable in enumerate(whole(variables)):
            store[f"{index}"] = variable.numpy()
        return None

    return save_own_variables


def _wrap_load_own_variables(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_own_variables(self: Any, store: Any) -> Any:
        if not _has_shards(_own_variables(self)):
            return original(self, store)
        self._update_trackables()
        variables = whole(_own_variables(self))
        if len(store.keys()) != len(variables):
            raise errors.ConfigError(
                f"Layer {self.name!r} has {len(variables)} variables (each split one "
                f"counted whole) but the file holds {len(store.keys())} for it. Load a "
                "file saved from this model's architecture."
            )
        for index, variable in enumerate(variables):
            variable.assign(store[f"{index}"])
        return None

    return load_own_variables


def _wrap_legacy_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def legacy_weights(layer: Any) -> Any:
        return whole(original(layer))

    return legacy_weights


def legacy_keras() -> bool:
    """Whether `tf.keras` is tf-keras (TF's own rule: TF_USE_LEGACY_KERAS)."""
    return os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")


def install() -> None:
    """Makes tf-keras list split variables whole in weights and files (idempotent; see module).

    Only where tf-keras is in use (`tf.keras` is tf-keras, or it is imported
    already): importing it into a Keras 3 process is not this module's to
    do. Call again once it is, to install.
    """
    global _installed
    with _INSTALL_LOCK:
        if _installed:
            return
        if _BASE_LAYER not in sys.modules and not legacy_keras():
            return
        base_layer = importlib.import_module(_BASE_LAYER)
        hdf5_format = importlib.import_module("tf_keras.src.saving.legacy.hdf5_format")
        layer = base_layer.Layer
        layer.get_weights = _wrap_get_weights(layer.get_weights)
        layer.set_weights = _wrap_set_weights(layer.set_weights)
        layer.save_own_variables = _wrap_save_own_variables(layer.save_own_variables)
        layer.load_own_variables = _wrap_load_own_variables(layer.load_own_variables)
        name = "_legacy_weights"
        setattr(hdf5_format, name, _wrap_legacy_weights(getattr(hdf5_format, name)))
        _installed = True
