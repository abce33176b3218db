"""Helpers shared by the sharder's tests: pipelines' outputs as global steps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def global_steps(per_pipeline: Sequence[Sequence[Any]], local_replicas: int) -> list[list[Any]]:
    """steps[k][global replica] from each pipeline's consecutive per-replica batches.

    Args:
      per_pipeline: One iteration of every pipeline: per_pipeline[p][i] is
        pipeline p's i-th per-replica batch.
      local_replicas: Replicas each pipeline feeds, R: batches i*R .. i*R+R-1
        of a pipeline form its part of global step i.

    Raises:
      AssertionError: If the pipelines ran different numbers of steps.
    """
    steps_per_pipeline = [
        [batches[k : k + local_replicas] for k in range(0, len(batches), local_replicas)]
        for batches in per_pipeline
    ]
    num_steps = {len(steps) for steps in steps_per_pipeline}
    assert len(num_steps) == 1, f"pipelines disagree on steps: {num_steps}"
    return [
        [b for steps in steps_per_pipeline for b in steps[k]]
        for k in range(num_steps.pop())
    ]


def step_weights(steps: Sequence[Sequence[Any]]) -> list[np.ndarray]:
    """Each global step's sample weights (component 2) over all replicas."""
    return [np.concatenate([b[2] for b in step]) for step in steps]
