"""Small helpers on dataset elements shared by the input paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist import errors

__all__ = ["empty_batch", "whole_element"]


def whole_element(structure: Any, fn: Callable[[Any], Any]) -> Callable[..., Any]:
    """`fn` adapted to `Dataset.map`/`flat_map`, which spread tuple elements.

    Returns a function of the spread components that rebuilds the element
    (tuple or namedtuple, as `structure` is) and calls `fn` on it.

    Args:
      structure: The dataset's `element_spec`.
      fn: Takes one whole element.
    """
    if not isinstance(structure, tuple):
        return tf.autograph.experimental.do_not_convert(fn)
    if hasattr(structure, "_fields"):
        rebuild: Callable[[tuple[Any, ...]], Any] = lambda parts: type(structure)(*parts)
    else:
        rebuild = tuple
    return tf.autograph.experimental.do_not_convert(lambda *parts: fn(rebuild(parts)))


def empty_batch(spec: tf.TypeSpec) -> Any:
    """A batch with zero rows that fits `spec` (dense, or ragged of ragged_rank 1).

    Unknown inner dimensions become 0, which stays compatible with `spec`.

    Raises:
      ConfigError: For other component types.
    """
    if isinstance(spec, tf.TensorSpec):
        shape = [0] + [0 if d is None else d for d in spec.shape.as_list()[1:]]
        return tf.zeros(shape, spec.dtype)
    if isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank == 1:
        inner = [0 if d is None else d for d in spec.shape.as_list()[2:]]
        return tf.RaggedTensor.from_row_splits(
            tf.zeros([0] + inner, spec.dtype),
            tf.zeros([1], spec.row_splits_dtype),
        )
    raise errors.ConfigError(
        f"cannot serve a component of type spec {spec!r} from the chief: "
        "tfdist supports dense tensors and ragged tensors with one ragged "
        "dimension there. Seed the pipeline's randomness so every worker "
        "can read it itself, or convert the component."
    )
