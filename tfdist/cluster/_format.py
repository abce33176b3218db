"""Bounded, never-failing `repr` for values quoted in cluster error messages.

TF_CONFIG can hold anything: megabyte strings, deeply nested lists, integers
with thousands of digits (whose plain `repr` raises `ValueError` on Python
3.11+), or, when passed as a mapping, objects whose `__repr__` fails. Error
messages quote the offending value, so quoting must be short and must not
raise. This module imports nothing from TensorFlow.
"""

from __future__ import annotations

import reprlib

__all__ = ["short_repr"]

# Integers wider than this many bits are described, not printed.
_MAX_INT_BITS = 256
# log10(2): converts a bit length into an approximate decimal digit count.
_DIGITS_PER_BIT = 0.30103


class _ShortRepr(reprlib.Repr):
    """A `reprlib.Repr` that describes very large integers instead."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > _MAX_INT_BITS:
            digits = int(x.bit_length() * _DIGITS_PER_BIT) + 1
            sign = "-" if x < 0 else ""
            return f"<{sign}int of about {digits} digits>"
        return super().repr_int(x, level)


_REPR = _ShortRepr()
_REPR.maxlevel = 3
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlong = 40
_REPR.maxlist = 6
_REPR.maxtuple = 6
_REPR.maxdict = 6
_REPR.maxset = 6


def short_repr(value: object) -> str:
    """Returns a `repr` of `value` of at most about 100 characters.

    Args:
      value: Any object, typically one decoded from TF_CONFIG.

    Returns:
      A truncated `repr`, or a short description such as `<int of about 5000
      digits>` or `<unprintable Foo>` when a `repr` would fail.

    Example:
      >>> short_repr("x" * 1000)[:5]
      "'xxxx"
    """
    try:
        return _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a user __repr__ may raise anything.
        return f"<unprintable {type(value).__name__}>"
