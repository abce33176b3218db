"""Keras 3 variables split over ps tasks: gradients and lookups per shard (Keras 3 private).

Under a `variable_partitioner`, the `tf.Variable` that a Keras 3 variable
wraps (`KerasVariable._value`) is created by TF's strategy as a
`ShardedVariable`: one variable per ps task, holding a range of rows.
Keras 3 knows nothing of that type; `active()` (entered by
`tfdist.ParameterServerStrategy` with a partitioner, for its scope and each
`strategy.run`) mends the two places where it fails or wastes:

- Gradients. Keras's train step (and a custom loop) asks
  `tf.GradientTape.gradient` for the gradient of each Keras variable; TF
  takes a variable's gradient through its one `handle`, which a split
  variable has not ("'ShardedVariable' object has no attribute 'handle'").
  `gradient` is wrapped: a split Keras variable is asked for as its shards
  (the tape watched each shard's read), and their gradients are joined
  into one for the whole variable: `IndexedSlices` (each shard's rows
  offset by the rows before it) when every shard's is, a dense concat
  otherwise. Other sources pass through untouched.
- Lookups. Keras's `Embedding` calls `ops.take(embeddings, ids, axis=0)`,
  which converts the whole table to a tensor (every row of every shard
  sent to the worker, each step). For a split variable `take` becomes
  `tf.nn.embedding_lookup(shards, ids)`: each ps gathers the rows asked of
  it, and the gradient is per-shard `IndexedSlices`.

- Checkpoints. A Keras 3 variable saves what its `tf.Variable` serializes,
  which a `ShardedVariable` does not do ("'ShardedVariable' object has no
  attribute 'device'"): it gives TF one saveable per shard, each a slice
  of the whole. `mark_split(variable)` (the strategy's variable creator
  calls it) moves that one Keras variable to a subclass that checkpoints
  through those saveables, as TF's own `ShardedVariable` does: the key is
  the whole variable's, so a checkpoint of N shards (or of a whole
  variable) restores into M shards, or whole. The subclass also reads as
  one array (`__array__`, which Keras's `numpy()`, `get_weights` and
  `save_weights` use and a `ShardedVariable` lacks).

A Keras optimizer then applies `IndexedSlices` with `scatter_*` on the
`ShardedVariable` (Keras 3's TF optimizer does so for sparse gradients),
which sends each shard only its own rows. That holds for update rules that
keep the gradient sparse (Keras 3's SGD without momentum); Keras 3's Adam,
Adagrad or momentum mix it with dense slots, so their update of a split
table is dense (correct, not sparse). The strategy's update of a split
variable (TF colocates an update with its variable, which a
`ShardedVariable` refuses) and slot variables split like their variable
are `tfdist/parameter_server/extended.py`'s.

Private Keras API used (tested range: see setup.py):
`keras.src.backend.tensorflow.numpy.take` (replaced by a wrapper while
active; Keras's `ops.take` looks it up at each call) and `KerasVariable._value`. Private
TF API: `ShardedVariable` (and its `_gather_saveables_for_checkpoint`),
and TF choosing a trackable's legacy saveables over `_serialize_to_tensors`
when the nearer class in its MRO defines them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable as _sharded_variable

from tfdist._internal import attributes
from tfdist._internal import tf_keras_sharded

__all__ = ["active", "installed", "join_gradients", "mark_split", "sharded_value"]

_ShardedVariable = _sharded_variable.ShardedVariable
def sharded_value(variable: Any) -> Any:
    """The `ShardedVariable` a Keras 3 variable wraps, or None (not Keras 3, or whole)."""
    value = getattr(variable, "_value", None)
    if isinstance(value, _ShardedVariable) and not isinstance(variable, tf.Variable):
        return value
    return None


def join_gradients(gradients: Sequence[Any], sharded: Any) -> Any:
    """One gradient for a whole split variable, from its shards' gradients (in shard order).

    `IndexedSlices` if every shard's is (or is None: no row of it used),
    with each shard's row indices offset by the rows of the shards before
    it; a dense tensor of the variable's shape otherwise; None if no shard
    has a gradient.
    """
    if all(g is None for g in gradients):
        return None
    shards = sharded.variables
    offsets = [0]
    for shard in shards[:-1]:
        offsets.append(offsets[-1] + int(shard.shape[0]))
    if all(g is None or isinstance(g, tf.IndexedSlices) for g in gradients):
        present = [(g, offset) for g, offset in zip(gradients, offsets) if g is not None]
        return tf.IndexedSlices(
            values=tf.concat([g.values for g, _ in present], axis=0),
            indices=tf.concat(
                [g.indices + tf.cast(offset, g.indices.dtype) for g, offset in present], axis=0
            ),
            dense_shape=tf.constant(sharded.shape.as_list(), tf.int64),
        )
    return tf.concat(
        [
            tf.zeros(shard.shape, shard.dtype) if g is None else tf.convert_to_tensor(g)
            for g, shard in zip(gradients, shards)
        ],
        axis=0,
    )


def _gradient_with_shards(original: Any) -> Any:
    """`tf.GradientTape.gradient`, asking for split Keras 3 variables shard by shard."""

    @functools.wraps(original)
    def gradient(tape: tf.GradientTape, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        flat = tf.nest.flatten(sources)
        split = [sharded_value(source) for source in flat]
        if all(s is None for s in split):
            return original(tape, target, sources, *args, **kwargs)
        asked: list[Any] = []
        spans = []
        for source, sharded in zip(flat, split):
            start = len(asked)
            asked.extend(sharded.variables if sharded is not None else [source])
            spans.append((start, len(asked)))
        found = original(tape, target, asked, *args, **kwargs)
        joined = [
            found[start] if sharded is None else join_gradients(found[start:end], sharded)
            for (start, end), sharded in zip(spans, split)
        ]
        return tf.nest.pack_sequence_as(sources, joined)

    return gradient


def _take_with_shards(original: Any) -> Any:
    """Keras 3's TF `take`, as an embedding lookup on the shards of a split variable."""

    @functools.wraps(original)
    def take(x: Any, indices: Any, axis: Any = None) -> Any:
        sharded = sharded_value(x)
        if (
            sharded is not None
            and axis == 0
            and not isinstance(indices, (tf.SparseTensor, tf.RaggedTensor))
        ):
            indices = tf.convert_to_tensor(indices)
            if indices.dtype not in (tf.int32, tf.int64):
                indices = tf.cast(indices, tf.int64)
            # Negative ids count from the end, as Keras's `take` does.
            indices = tf.where(indices < 0, indices + int(sharded.shape[0]), indices)
            return tf.nn.embedding_lookup(sharded, indices)
        return original(x, indices, axis=axis)

    return take


def _gather_shard_saveables(variable: Any) -> Any:
    """`Trackable._gather_saveables_for_checkpoint` of a split Keras 3 variable: its shards'."""
    return variable._value._gather_saveables_for_checkpoint()


def _whole_array(variable: Any, dtype: Any = None, copy: Any = None) -> Any:
    """`__array__` of a split Keras 3 variable: the whole value (TF's `ShardedVariable` has none)."""
    del copy  # A new array either way.
    return np.asarray(variable._value.numpy(), dtype=dtype)


#: Keras variable class -> its subclass that checkpoints as shards.
_SPLIT_CLASSES: dict[type, type] = {}


def mark_split(variable: Any) -> None:
    """Makes Keras 3 `variable`, whose `tf.Variable` is a ShardedVariable, checkpoint as its shards.

    Changes the class of that one instance to a subclass defining only
    `_gather_saveables_for_checkpoint` (TF then takes the legacy saveables
    path for it, as for a `ShardedVariable`) and `__array__` (Keras's reads
    the `tf.Variable`'s, which a `ShardedVariable` lacks: `save_weights`
    and `numpy()` failed). Idempotent.
    """
    base = type(variable)
    if base in _SPLIT_CLASSES.values():
        return
    split_class = _SPLIT_CLASSES.get(base)
    if split_class is None:
        split_class = type(
            f"Split{base.__name__}",
            (base,),
            {
                "_gather_saveables_for_checkpoint": _gather_shard_saveables,
                "__array__": _whole_array,
                "__module__": __name__,
                "__doc__": f"A {base.__name__} split over ps tasks (tfdist).",
            },
        )
        _SPLIT_CLASSES[base] = split_class
    variable.__class__ = split_class


#: Keras 3's TF backend module holding `take`.
_KERAS3_TF_NUMPY = "keras.src.backend.tensorflow.numpy"


def _targets() -> list[attributes.Target]:
    """`tf.GradientTape.gradient`, and Keras 3's `take` where Keras 3 is in use.

    Keras 3's module is imported only when `tf.keras` is Keras 3 (or it is
    imported already): importing Keras 3 into a tf-keras process changes
    that process's training (TF's tutorial under tf-keras trained
    differently, deterministically, once it was imported). Safe without
    Keras 3 installed.
    """
    targets: list[attributes.Target] = [(tf.GradientTape, "gradient", _gradient_with_shards)]
    keras_tf_numpy: Any = sys.modules.get(_KERAS3_TF_NUMPY)
    if keras_tf_numpy is None and not tf_keras_sharded.legacy_keras():
        try:
            keras_tf_numpy = importlib.import_module(_KERAS3_TF_NUMPY)
        except ImportError:  # No Keras 3: tf-keras trains split variables itself.
            keras_tf_numpy = None
    if keras_tf_numpy is not None:
        targets.append((keras_tf_numpy, "take", _take_with_shards))
    return targets


#: The two wrappers, installed while any `active()` block is open.
_PATCH = attributes.SharedPatch(_targets)


def active() -> contextlib.AbstractContextManager[None]:
    """Keras 3 trains and looks up split variables inside the block (see module).

    Re-entrant and thread-safe: the first block entered installs the
    wrappers of `tf.GradientTape.gradient` and Keras 3's `take`, the last
    one left puts TF's and Keras's functions back, so outside every block
    TF and Keras are as tfdist found them. `tfdist.ParameterServerStrategy`
    with a partitioner opens one for its scope and around each
    `strategy.run` (where Keras's steps and a custom loop's replica
    function take gradients and look rows up). While one is open, other
    threads' calls go through the wrappers too, unchanged unless they name
    a split variable.
    """
    return _PATCH.active()


def installed() -> bool:
    """Whether the wrappers are in place now (some `active()` block is open)."""
    return _PATCH.installed
