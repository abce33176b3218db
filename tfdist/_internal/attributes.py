"""Changing another object's attributes or class: for a `with` block, or in place.

Outside `tfdist/_internal/`, tfdist changes no other object's class and
writes no other object's instance `__dict__` except through these
(`tests/unit/tooling/build_test.py` checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["instance_attributes", "swap_class", "swapped"]


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


@contextlib.contextmanager
def instance_attributes(owner: Any, values: dict[str, Any]) -> Iterator[None]:
    """Sets `values` in `owner`'s instance `__dict__` inside the block (shadowing its class's).

    After the block `owner`'s own attributes of those names are as they
    were: removed, or their previous values back. For methods to replace on
    one instance (the class and every other instance keep theirs).
    """
    own = vars(owner)
    missing = object()
    previous = {name: own.get(name, missing) for name in values}
    own.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is missing:
                own.pop(name, None)
            else:
                own[name] = value


def swap_class(owner: Any, cls: type) -> None:
    """Makes `owner` an instance of `cls`, a subclass of its class, in place (for good)."""
    assert issubclass(cls, type(owner)), (cls, type(owner))
    owner.__class__ = cls
