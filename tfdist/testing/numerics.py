"""Numerical comparisons of models, reporting the worst variable by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tfdist import errors

__all__ = [
    "Comparison",
    "assert_inference_matches",
    "assert_matches_single_device",
    "assert_weights_close",
    "max_weight_difference",
]


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


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What `assert_matches_single_device` trained and measured.

    Attributes:
      single_device_model: The reference model (default strategy).
      distributed_model: The model trained under the strategy.
      single_device_history: `History.history` of the reference `fit`.
      distributed_history: `History.history` of the distributed `fit`.
      max_weight_difference: (variable name, max `abs(a - b)`) after `fit`.
    """

    single_device_model: Any
    distributed_model: Any
    single_device_history: dict[str, list[float]]
    distributed_history: dict[str, list[float]]
    max_weight_difference: tuple[str, float]


def assert_matches_single_device(
    build_model: Callable[[], Any],
    strategy: Any,
    x: Any,
    y: Any,
    *,
    global_batch_size: int,
    epochs: int,
    rtol: float,
    atol: float,
    sample_weight: Any = None,
    fit_kwargs: Mapping[str, Any] | None = None,
    check_inference: bool = True,
) -> Comparison:
    """Trains one model on one device and under `strategy`; asserts they match.

    `build_model` must build *and compile* a fresh model (Keras 3 or
    tf-keras); it is called once outside any strategy and once inside
    `strategy.scope()`. The distributed model starts from the reference
    model's initial weights; both see the same examples in the same order
    (`shuffle=False`) with batch size `global_batch_size`.

    After `fit`, asserts that weights, `evaluate` results and `predict`
    outputs agree within `rtol`/`atol`.

    Args:
      build_model: Returns a compiled model; called twice.
      strategy: A `tf.distribute.Strategy` (typically a tfdist strategy).
      x: Inputs as numpy arrays (or a structure of them).
      y: Targets.
      global_batch_size: Batch size of both runs (summed over replicas).
      epochs: Epochs of both runs.
      rtol: Relative tolerance.
      atol: Absolute tolerance.
      sample_weight: Optional per-example weights for both runs.
      fit_kwargs: Extra keyword arguments for both `fit` calls.
      check_inference: Also compare `evaluate` metrics and `predict`
        outputs (three more traced functions per model).

    Returns:
      A `Comparison` with both models and histories.

    Raises:
      AssertionError: If weights, metrics or predictions differ.
    """
    # Any: Keras 3 and tf-keras models share no common base class.
    fit_kwargs = dict(fit_kwargs or {})
    reference = build_model()
    initial_weights = [np.copy(w) for w in reference.get_weights()]
    with strategy.scope():
        distributed = build_model()
    distributed.set_weights(initial_weights)
    histories = []
    for model in (reference, distributed):
        history = model.fit(
            x,
            y,
            sample_weight=sample_weight,
            batch_size=global_batch_size,
            epochs=epochs,
            shuffle=False,
            verbose=0,
            **fit_kwargs,
        )
        histories.append(history.history)
    assert_weights_close(distributed, reference, rtol=rtol, atol=atol)
    comparison = Comparison(
        single_device_model=reference,
        distributed_model=distributed,
        single_device_history=histories[0],
        distributed_history=histories[1],
        max_weight_difference=max_weight_difference(distributed, reference),
    )
    if check_inference:
        assert_inference_matches(
            reference, distributed, x, y,
            batch_size=global_batch_size, rtol=rtol, atol=atol,
        )
    return comparison


def assert_inference_matches(
    reference: Any,
    candidate: Any,
    x: Any,
    y: Any,
    *,
    batch_size: int,
    rtol: float,
    atol: float,
) -> None:
    """Asserts `evaluate` metrics and `predict` outputs of two models agree.

    Raises:
      AssertionError: Naming the metric, or "predict", that differs.
    """
    # Any: Keras 3 and tf-keras models share no common base class.
    evaluations = [
        model.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True)
        for model in (reference, candidate)
    ]
    for name, value in evaluations[0].items():
        np.testing.assert_allclose(
            evaluations[1][name], value, rtol=rtol, atol=atol,
            err_msg=f"evaluate() metric {name!r} differs",
        )
    predictions = [
        model.predict(x, batch_size=batch_size, verbose=0)
        for model in (reference, candidate)
    ]
    np.testing.assert_allclose(
        predictions[1], predictions[0], rtol=rtol, atol=atol,
        err_msg="predict() outputs differ",
    )
