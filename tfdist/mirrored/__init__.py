"""Mirrored data parallelism on one machine's devices: `tfdist.MirroredStrategy`.

- `strategy`: the strategy class (TF's `MirroredStrategy` with tfdist's
  collectives, `tfdist/collectives/`, and input path, `tfdist/data/distributed/`).

Its extended class is `tfdist/_internal/mirrored_extended.py` (it overrides
TF's private update path).
"""

from __future__ import annotations

from tfdist.mirrored.strategy import MirroredStrategy

__all__ = ["MirroredStrategy"]
