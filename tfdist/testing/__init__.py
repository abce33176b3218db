"""Test helpers shipped with tfdist, so users can test their own models.

Public API: `use_logical_cpus`, `main`, `assert_weights_close`.
"""

from __future__ import annotations

from tfdist.testing.devices import main
from tfdist.testing.devices import use_logical_cpus
from tfdist.testing.numerics import assert_weights_close

__all__ = [
    "assert_weights_close",
    "main",
    "use_logical_cpus",
]
