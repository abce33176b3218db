"""Which kind of traced function a graph is (TF private).

Private TF API used (tested range: see setup.py):
`control_flow_v2_func_graphs.CondBranchFuncGraph`, the class of a
`tf.cond` branch's graph (TF has no public way to tell a branch from a
`tf.while_loop` body or a nested `tf.function`).
"""

from __future__ import annotations

from typing import Any

from tensorflow.python.ops import control_flow_v2_func_graphs as _func_graphs

__all__ = ["is_cond_branch"]


def is_cond_branch(graph: Any) -> bool:
    """Whether `graph` is a `tf.cond` (or `tf.switch_case`) branch being traced: run at most once per call."""
    return isinstance(graph, _func_graphs.CondBranchFuncGraph)
