"""Numerical comparisons of models, reporting the worst variable by name."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tfdist import errors

__all__ = [
    "Comparison",
    "SingleDeviceRun",
    "assert_inference_matches",
    "assert_matches_single_device",
    "assert_weights_close",
    "max_weight_difference",
    "train_single_device",
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


@dataclasses.dataclass(frozen=True)
class SingleDeviceRun:
    """A one-device reference run that several comparisons can share.

    Made by `train_single_device`; passed as `reference=` to
    `assert_matches_single_device`, which then trains only the distributed
    model, from `initial_weights`, and checks that it gets the same
    arguments the reference was trained with. Comparisons must not change
    `model` (they only read its weights and run `evaluate`/`predict`).

    Attributes:
      model: The trained reference model (built outside any strategy).
      initial_weights: Its weights before `fit`.
      history: `History.history` of its `fit`.
      fit_arguments: What it was trained with (data fingerprints, batch
        size, epochs, extra `fit` arguments), for the check.
    """

    model: Any
    initial_weights: list[np.ndarray]
    history: dict[str, list[float]]
    fit_arguments: tuple[Any, ...]


def _fingerprint(value: Any) -> Any:
    """A comparable summary of `fit`'s data: shapes, dtypes and bytes of each array."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return tuple((k, _fingerprint(v)) for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_fingerprint(v) for v in value)
    array = np.asarray(value)
    return (array.shape, array.dtype.str, hash(array.tobytes()))


def _fit_arguments(
    x: Any, y: Any, sample_weight: Any, global_batch_size: int, epochs: int,
    fit_kwargs: Mapping[str, Any],
) -> tuple[Any, ...]:
    return (
        _fingerprint(x), _fingerprint(y), _fingerprint(sample_weight),
        global_batch_size, epochs, repr(sorted(fit_kwargs.items())),
    )


def _fit(model: Any, x: Any, y: Any, sample_weight: Any, global_batch_size: int,
         epochs: int, fit_kwargs: Mapping[str, Any]) -> dict[str, list[float]]:
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
    return history.history


def train_single_device(
    build_model: Callable[[], Any],
    x: Any,
    y: Any,
    *,
    global_batch_size: int,
    epochs: int,
    sample_weight: Any = None,
    fit_kwargs: Mapping[str, Any] | None = None,
) -> SingleDeviceRun:
    """Builds and trains the one-device reference of `assert_matches_single_device`.

    Train it once and pass it as `reference=` to every comparison of the
    same model and data (a grid of strategies or configurations), instead
    of retraining one device for each.

    Args:
      build_model: Returns a compiled model; called once, outside any strategy.
      x, y, global_batch_size, epochs, sample_weight, fit_kwargs: As for
        `assert_matches_single_device`; every comparison given this run
        must pass the same.

    Returns:
      The trained `SingleDeviceRun`.
    """
    fit_kwargs = dict(fit_kwargs or {})
    model = build_model()
    initial_weights = [np.copy(w) for w in model.get_weights()]
    history = _fit(model, x, y, sample_weight, global_batch_size, epochs, fit_kwargs)
    return SingleDeviceRun(
        model=model,
        initial_weights=initial_weights,
        history=history,
        fit_arguments=_fit_arguments(x, y, sample_weight, global_batch_size, epochs, fit_kwargs),
    )


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
    reference: SingleDeviceRun | None = None,
) -> Comparison:
    """Trains one model on one device and under `strategy`; asserts they match.

    `build_model` must build *and compile* a fresh model (Keras 3 or
    tf-keras); it is called once outside any strategy (unless `reference`
    is given) and once inside `strategy.scope()`. The distributed model
    starts from the reference model's initial weights; both see the same
    examples in the same order (`shuffle=False`) with batch size
    `global_batch_size`.

    After `fit`, asserts that weights, `evaluate` results and `predict`
    outputs agree within `rtol`/`atol`.

    Args:
      build_model: Returns a compiled model.
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
      reference: A `train_single_device` run of the same model and
        arguments, shared with other comparisons; `None` trains one here.

    Returns:
      A `Comparison` with both models and histories.

    Raises:
      AssertionError: If weights, metrics or predictions differ.
      ConfigError: If `reference` was trained with other data, batch
        size, epochs or `fit` arguments than this call's.
    """
    # Any: Keras 3 and tf-keras models share no common base class.
    fit_kwargs = dict(fit_kwargs or {})
    if reference is None:
        reference = train_single_device(
            build_model, x, y, global_batch_size=global_batch_size, epochs=epochs,
            sample_weight=sample_weight, fit_kwargs=fit_kwargs)
    elif reference.fit_arguments != _fit_arguments(
            x, y, sample_weight, global_batch_size, epochs, fit_kwargs):
        raise errors.ConfigError(
            "reference= was trained with other fit arguments than this comparison's: "
            f"received global_batch_size={global_batch_size}, epochs={epochs}, "
            f"fit_kwargs={fit_kwargs!r} and data of shapes "
            f"{_fingerprint(x)!r:.200}, against the reference's "
            f"{reference.fit_arguments!r:.300}. Pass the same data and arguments as "
            "train_single_device got, or train a reference for these."
        )
    with strategy.scope():
        distributed = build_model()
    distributed.set_weights(reference.initial_weights)
    distributed_history = _fit(
        distributed, x, y, sample_weight, global_batch_size, epochs, fit_kwargs)
    assert_weights_close(distributed, reference.model, rtol=rtol, atol=atol)
    comparison = Comparison(
        single_device_model=reference.model,
        distributed_model=distributed,
        single_device_history=reference.history,
        distributed_history=distributed_history,
        max_weight_difference=max_weight_difference(distributed, reference.model),
    )
    if check_inference:
        assert_inference_matches(
            reference.model, distributed, x, y,
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
