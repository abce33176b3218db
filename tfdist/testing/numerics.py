"""Numerical comparisons of models, reporting the worst variable by name."""

from __future__ import annotations

from typing import Any

import numpy as np

from tfdist import errors

__all__ = ["assert_weights_close", "max_weight_difference"]


def _named_weights(model: Any) -> list[tuple[str, np.ndarray]]:
    # `model` is a Keras 3 or a tf-keras model; they share no base class.
    return [
        (getattr(v, "path", None) or v.name, np.asarray(v.numpy()))
        for v in model.weights
    ]


def max_weight_difference(model_a: Any, model_b: Any) -> tuple[str, float]:
    """Returns (variable name, max |a - b|) for the worst-matching variable.

    Raises:
      ConfigError: If the models' weight lists differ in length or shapes.
    """
    weights_a = _named_weights(model_a)
    weights_b = _named_weights(model_b)
    if len(weights_a) != len(weights_b):
        raise errors.ConfigError(
            f"models have different numbers of weights: {len(weights_a)} vs "
            f"{len(weights_b)}. Compare models built by the same function."
        )
    worst = ("", 0.0)
    for (name, a), (_, b) in zip(weights_a, weights_b):
        if a.shape != b.shape:
            raise errors.ConfigError(
                f"weight {name!r} has shape {a.shape} in model_a and "
                f"{b.shape} in model_b. Compare models built by the same "
                "function."
            )
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        if diff >= worst[1]:
            worst = (name, diff)
    return worst


def assert_weights_close(
    model_a: Any, model_b: Any, *, rtol: float, atol: float
) -> None:
    """Asserts every weight of `model_a` is close to the same in `model_b`.

    Weights are matched by position in `model.weights` (models built by the
    same function); closeness is `|a - b| <= atol + rtol * |b|` elementwise,
    as in `numpy.testing.assert_allclose`.

    Raises:
      AssertionError: Naming the worst variable, its max abs difference and
        the tolerances, if any element is outside them.
    """
    max_weight_difference(model_a, model_b)  # Raises on mismatched structure.
    failures = []
    for (name, a), (_, b) in zip(_named_weights(model_a), _named_weights(model_b)):
        bound = atol + rtol * np.abs(b)
        excess = np.abs(a - b) - bound
        if a.size and np.max(excess) > 0:
            failures.append((float(np.max(np.abs(a - b))), name))
    if failures:
        diff, name = max(failures)
        raise AssertionError(
            f"{len(failures)} weight(s) differ beyond rtol={rtol}, atol={atol}; "
            f"worst is {name!r} with max |a - b| = {diff:.3g}. "
            f"All failing: {[n for _, n in sorted(failures, reverse=True)]}"
        )
