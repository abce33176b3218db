"""Argument checks shared by tfdist's public constructors and factories.

Each check raises `TypeError` for a wrong type and a `ConfigError` (or the
subclass passed as `error`) for a wrong value, with a message in tfdist's
form: what is wrong, the value received, what was expected, how to fix it.
This module imports nothing from TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from tfdist import errors

_T = TypeVar("_T")


def check_bool(name: str, value: object) -> bool:
    """Returns `value` if it is a `bool`, else raises TypeError."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be a bool; received {name}={value!r} of type "
            f"{type(value).__name__}."
        )
    return value


def check_int(name: str, value: object) -> int:
    """Returns `value` if it is an `int` (not a `bool`), else raises TypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int; received {name}={value!r} "
            f"of type {type(value).__name__}."
        )
    return value


def check_positive_int(
    name: str,
    value: object,
    *,
    error: type[errors.ConfigError] = errors.ConfigError,
) -> int:
    """Returns `value` if it is an int >= 1.

    Raises:
      TypeError: If `value` is not an int.
      ConfigError: (or `error`) If `value` < 1.
    """
    value = check_int(name, value)
    if value < 1:
        raise error(
            f"{name} must be a positive integer; received {name}={value!r}. "
            f"Pass an integer >= 1."
        )
    return value


def check_non_negative_int(
    name: str,
    value: object,
    *,
    error: type[errors.ConfigError] = errors.ConfigError,
) -> int:
    """Returns `value` if it is an int >= 0.

    Raises:
      TypeError: If `value` is not an int.
      ConfigError: (or `error`) If `value` < 0.
    """
    value = check_int(name, value)
    if value < 0:
        raise error(
            f"{name} must be a non-negative integer; received "
            f"{name}={value!r}. Pass an integer >= 0."
        )
    return value


def check_positive_number(name: str, value: object) -> float:
    """Returns `value` as a float if it is a finite real number > 0.

    Raises:
      TypeError: If `value` is not an int or float.
      ConfigError: If `value` <= 0 or is not finite.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number; received {name}={value!r} "
            f"of type {type(value).__name__}."
        )
    if not value > 0 or value == float("inf"):
        raise errors.ConfigError(
            f"{name} must be a finite number > 0; received {name}={value!r}. "
            "Pass a positive number of seconds, bytes or items as named."
        )
    return float(value)


def check_one_of(name: str, value: _T, choices: Iterable[_T]) -> _T:
    """Returns `value` if it is one of `choices`.

    Raises:
      ConfigError: If `value` is not in `choices`; the message lists them.
    """
    choices = tuple(choices)
    if value not in choices:
        raise errors.ConfigError(
            f"{name}={value!r} is not supported. Expected one of "
            f"{', '.join(repr(c) for c in choices)}."
        )
    return value


def check_batch_divides(name: str, batch_size: int, num_replicas: int) -> None:
    """Raises ConfigError unless `batch_size` splits evenly over replicas.

    The message names the batch sizes nearest `batch_size` that work.
    """
    if batch_size % num_replicas == 0:
        return
    lower = batch_size - batch_size % num_replicas
    upper = lower + num_replicas
    suggestions = " or ".join(str(s) for s in (lower, upper) if s > 0)
    raise errors.ConfigError(
        f"{name}={batch_size} is not divisible by "
        f"num_replicas_in_sync={num_replicas}; every replica must get "
        f"the same per-replica batch. Use a multiple of {num_replicas}, "
        f"such as {suggestions}."
    )
