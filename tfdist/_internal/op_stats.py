"""Forward FLOPs of a traced graph, by name scope (TF private).

TensorFlow registers a "flops" statistic for its compute ops (MatMul,
Conv2D, element-wise math, ...; the profiler's `flops_registry` adds the
rest it knows); an op without one counts 0. Shapes must be static.

Private TF API used (tested range: see setup.py):
`ops.get_stats_for_node_def`, `profiler.internal.flops_registry`, and
`deprecation.silence` (the statistics read shapes with a v1 helper that
logs a deprecation notice).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorflow.python.framework import ops as _ops
from tensorflow.python.profiler.internal import flops_registry as _flops_registry  # noqa: F401  Registers statistics.
from tensorflow.python.util import deprecation as _deprecation

__all__ = ["flops_by_scope"]


def flops_by_scope(graph: Any, scopes: Sequence[str]) -> list[float]:
    """FLOPs of the ops of `graph` under each of `scopes` ("model/dense/").

    An op counts toward the longest scope its name starts with.
    """
    totals = [0.0] * len(scopes)
    ordered = sorted(range(len(scopes)), key=lambda i: -len(scopes[i]))
    for op in graph.get_operations():
        index = next((i for i in ordered if op.name.startswith(scopes[i])), None)
        if index is None:
            continue
        try:
            with _deprecation.silence():
                stats = _ops.get_stats_for_node_def(graph, op.node_def, "flops")
        except (ValueError, TypeError):  # An unknown dimension.
            continue
        if stats.value:
            totals[index] += float(stats.value)
    return totals
