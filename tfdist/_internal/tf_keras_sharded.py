"""tf-keras sees each variable split over ps tasks whole, in weights and weight files (tf-keras private).

tf-keras's `add_weight` lists a `ShardedVariable`'s shards among the
layer's weights, one by one (its optimizers train shards). So a split
`Embedding` table comes out of `get_weights()` as one array per shard,
`set_weights` wants it so, and a weights file holds shards: what a model on
one device (or split otherwise) neither gives nor loads. Keras 3 lists the
variable whole. `track(obj)` wraps, on one layer or model instance, the
methods that read its weights as values, so that wherever its weights hold
every shard of one split variable, in order, they stand for it as one:

- `get_weights` joins the shards' arrays (rows in shard order);
- `set_weights` takes one array and assigns each shard its rows (a list of
  the shards' arrays, as tf-keras took it, is still taken);
- `save_own_variables` / `load_own_variables` (tf-keras's `.keras` and
  `.weights.h5` files) store one entry for it;
- a model's `save_weights` / `load_weights`: while they run,
  `hdf5_format._legacy_weights` (tf-keras's legacy `.h5` weights) lists the
  `ShardedVariable` itself, which reads and assigns as a whole.

`tfdist.ParameterServerStrategy`'s variable creator, under tf-keras, tracks
each layer whose `add_weight` it splits a variable for (`creating_layer`)
and each model built in its scope (`creating_model`, from the model's step
counters). Other layers and models, and tf-keras's classes, are untouched.

Training is untouched: `trainable_weights` still lists shards. A
checkpoint in TF's format was whole already (a split variable saves as
slices of one key).

Private tf-keras API used (tested range: setup.py): `Layer.get_weights`,
`set_weights`, `save_own_variables`, `load_own_variables`, `add_weight`
(the frame a split variable's layer is found from), `Model.save_weights`,
`load_weights`, `_create_counter_variable` / `_init_batch_counters` (the
frames a model is found from), `saving.legacy.hdf5_format._legacy_weights`;
private TF: a shard's `_sharded_container` (the weak reference TF sets to
its `ShardedVariable`).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist import errors
from tfdist._internal import attributes
from tfdist._internal import keras_ps

__all__ = [
    "creating_layer", "creating_model", "in_use", "legacy_keras", "track", "whole",
]

_BASE_LAYER = "tf_keras.src.engine.base_layer"
_TRAINING = "tf_keras.src.engine.training"
_HDF5_FORMAT = "tf_keras.src.saving.legacy.hdf5_format"
#: How far up the stack `creating_layer` and `creating_model` look: from
#: TF's variable creator to tf-keras's method, through TF's creator chain.
_MAX_FRAMES = 24


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


def in_use() -> bool:
    """Whether this process uses tf-keras (`tf.keras` is tf-keras, or it is imported)."""
    return legacy_keras() or _BASE_LAYER in sys.modules


def _legacy_weights_targets() -> list[attributes.Target]:
    hdf5_format = importlib.import_module(_HDF5_FORMAT)
    return [(hdf5_format, "_legacy_weights", _wrap_legacy_weights)]


#: tf-keras's legacy `.h5` weights list split variables whole, while a
#: tracked model's `save_weights` or `load_weights` runs.
_LEGACY_WEIGHTS = attributes.SharedPatch(_legacy_weights_targets)


def _during_legacy_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _LEGACY_WEIGHTS.active():
            return original(self, *args, **kwargs)

    return call


#: Set on an instance `track` has changed.
_TRACKED = "_tfdist_lists_split_variables_whole"


def track(obj: Any) -> None:
    """Makes one tf-keras layer or model list its split variables whole (idempotent).

    On this instance only (its class and every other instance keep
    tf-keras's methods): `get_weights`, `set_weights`, `save_own_variables`
    and `load_own_variables` (see module); a model's `save_weights` and
    `load_weights` also list split variables whole in legacy `.h5` files
    (tf-keras's `hdf5_format._legacy_weights`, replaced for the call only).
    Where an instance holds no split variable, each passes through.
    """
    own = vars(obj)
    if own.get(_TRACKED):
        return
    cls = type(obj)
    methods: dict[str, Any] = {
        name: types.MethodType(wrap(getattr(cls, name)), obj)
        for name, wrap in (
            ("get_weights", _wrap_get_weights),
            ("set_weights", _wrap_set_weights),
            ("save_own_variables", _wrap_save_own_variables),
            ("load_own_variables", _wrap_load_own_variables),
        )
    }
    for name in ("save_weights", "load_weights"):
        if hasattr(cls, name):  # A model.
            methods[name] = types.MethodType(_during_legacy_weights(getattr(cls, name)), obj)
    methods[_TRACKED] = True
    attributes.set_instance_attributes(obj, methods)


def _creating(module: str, class_name: str, methods: tuple[str, ...]) -> Any:
    """The instance of tf-keras's `module.class_name` whose `methods` frame is on the stack, or None."""
    cls = getattr(sys.modules.get(module), class_name, None)
    if cls is None:
        return None
    codes = {getattr(getattr(cls, name, None), "__code__", None) for name in methods}
    for frame in keras_ps.frames_up(2, limit=_MAX_FRAMES):
        if frame.f_code in codes:
            found = frame.f_locals.get("self")
            return found if isinstance(found, cls) else None
    return None


def creating_layer() -> Any:
    """The tf-keras layer whose `add_weight` creates the variable being created, or None.

    For a strategy's variable creator, once it has split a variable (a
    bounded walk up the stack; not on every variable creation).
    """
    return _creating(_BASE_LAYER, "Layer", ("add_weight",))


def creating_model(kwargs: dict[str, Any]) -> Any:
    """The tf-keras model whose step counters are being created, or None.

    tf-keras's `Model.__init__` creates three int64 scalar counters with
    `ONLY_FIRST_REPLICA` aggregation; for those (and only those, told by
    `kwargs` before any walk up the stack) the model is returned, so a
    strategy finds every tf-keras model built in its scope as it is built.
    """
    if kwargs.get("aggregation") != tf.VariableAggregation.ONLY_FIRST_REPLICA:
        return None
    if tf.as_dtype(kwargs.get("dtype") or tf.float32) != tf.int64:
        return None
    return _creating(_TRAINING, "Model", ("_create_counter_variable", "_init_batch_counters"))
