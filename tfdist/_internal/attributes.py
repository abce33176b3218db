"""Changing another object's attributes or class: for a `with` block, or in place.

Outside `tfdist/_internal/`, tfdist changes no other object's class and
writes no other object's instance `__dict__` except through these
(`tests/unit/tooling/build_test.py` checks).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["SharedPatch", "instance_attributes", "set_instance_attributes", "swap_class", "swapped"]


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


def set_instance_attributes(owner: Any, values: dict[str, Any]) -> None:
    """Sets `values` in `owner`'s instance `__dict__`, for the instance's life.

    Shadows its class's attributes on this one instance (methods to replace
    on it: the class and every other instance keep theirs), bypassing the
    instance's own `__setattr__` (Keras's tracks what it is given).
    """
    vars(owner).update(values)


#: (owner, attribute name, wrap): while a `SharedPatch` is active,
#: `owner.name` is `wrap(what it was)`.
Target = tuple[Any, str, Callable[[Any], Any]]


class SharedPatch:
    """Attributes of classes or modules replaced while any holder is inside `active()`.

    The first `active()` block entered (in any thread) installs each
    target's wrapper; the last one left puts back exactly what it replaced.
    Outside every block the targets are untouched, so a patch lives no
    longer than the strategy, scope or call that holds it. While any block
    is open the wrappers are process-wide: a wrapper must pass through
    calls that are not its business.

    Args:
      targets: Called at each first entry: the `(owner, name, wrap)` to
        install (empty when the library to patch is not in use).
    """

    def __init__(self, targets: Callable[[], Sequence[Target]]) -> None:
        self._targets = targets
        self._lock = threading.Lock()
        self._holders = 0
        self._replaced: list[tuple[Any, str, Any]] = []

    @property
    def installed(self) -> bool:
        """Whether some holder is inside `active()`."""
        return self._holders > 0

    def acquire(self) -> None:
        """Enters: installs the wrappers if no holder was in. Pair with `release()`."""
        with self._lock:
            if self._holders == 0:
                for owner, name, wrap in self._targets():
                    original = getattr(owner, name)
                    self._replaced.append((owner, name, original))
                    setattr(owner, name, wrap(original))
            self._holders += 1

    def release(self) -> None:
        """Leaves: when the last holder leaves, puts back what was replaced."""
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                for owner, name, original in reversed(self._replaced):
                    setattr(owner, name, original)
                self._replaced.clear()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The wrappers installed inside the block (re-entrant, thread-safe)."""
        self.acquire()
        try:
            yield
        finally:
            self.release()


def swap_class(owner: Any, cls: type) -> None:
    """Makes `owner` an instance of `cls`, a subclass of its class, in place (for good)."""
    assert issubclass(cls, type(owner)), (cls, type(owner))
    owner.__class__ = cls
