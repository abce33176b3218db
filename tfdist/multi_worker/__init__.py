"""Data parallelism over the workers of a TF_CONFIG cluster: `tfdist.MultiWorkerMirroredStrategy`.

- `strategy`: the strategy class (TF's `MultiWorkerMirroredStrategy` with
  tfdist's hierarchical collectives, `tfdist/collectives/cross_worker.py`,
  bounded start-up and peer watchdog, `tfdist/watchdog/`, and one input
  pipeline per worker, `tfdist/data/distributed/`).
- `transport`: which path gradient buckets take between workers (shared
  memory where the workers share one host's, else gRPC).
"""

from __future__ import annotations

from tfdist.multi_worker.strategy import MultiWorkerMirroredStrategy

__all__ = ["MultiWorkerMirroredStrategy"]
