"""Test helpers shipped with tfdist, so users can test their own models.

Public API: `use_logical_cpus`, `main`, `assert_weights_close`,
`assert_matches_single_device` (with `train_single_device` for a reference
several comparisons share), `run_local_cluster`, `run_local_ps_job`,
`start_local_ps_cluster`, `small_classifier`, `small_embedding_classifier`.
"""

from __future__ import annotations

from tfdist.testing.local_jobs import run_local_cluster
from tfdist.testing.devices import main
from tfdist.testing.devices import use_logical_cpus
from tfdist.testing.numerics import Comparison
from tfdist.testing.numerics import SingleDeviceRun
from tfdist.testing.numerics import assert_matches_single_device
from tfdist.testing.numerics import assert_weights_close
from tfdist.testing.numerics import train_single_device
from tfdist.testing.models import small_classifier
from tfdist.testing.models import small_embedding_classifier
from tfdist.testing.ps_jobs import run_local_ps_job
from tfdist.testing.ps_jobs import start_local_ps_cluster

__all__ = [
    "Comparison",
    "SingleDeviceRun",
    "assert_matches_single_device",
    "assert_weights_close",
    "main",
    "run_local_cluster",
    "run_local_ps_job",
    "small_classifier",
    "small_embedding_classifier",
    "start_local_ps_cluster",
    "train_single_device",
    "use_logical_cpus",
]
