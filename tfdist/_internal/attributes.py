"""Setting an attribute for the length of a `with` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["swapped"]


@contextlib.contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[None]:
    """Sets `owner.name = value` inside the block; restores the previous value (or None) after.

    Not thread-safe across threads sharing `owner` (pass a `threading.local`
    for per-thread values).
    """
    previous = getattr(owner, name, None)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, previous)
