"""Tensor and data parallelism over a device mesh: `tfdist.MeshStrategy`.

Modules, one job each:

- `layouts` (pure Python): the mesh (`MeshSpec`) and which layout each
  variable gets (`LayoutRules`), every check a `tfdist.errors.LayoutError`;
  `DeviceMesh` and `LayoutMap`, Keras 3's of the same names for tf-keras;
- `strategy`: the strategy class (imported by `tfdist.MeshStrategy`, not
  by this package), its input on the mesh and its Keras step functions;
- `_extended`: its `StrategyExtended` (every variable a DTensor laid out by
  the rules), over TF's one-replica contract in
  `tfdist/_internal/single_replica.py`;
- `_dtensor`: tensors and variables as TF's DTensor holds them.
"""

from __future__ import annotations

from tfdist.mesh.layouts import DeviceMesh
from tfdist.mesh.layouts import LayoutMap
from tfdist.mesh.layouts import LayoutRules
from tfdist.mesh.layouts import MeshSpec

__all__ = ["DeviceMesh", "LayoutMap", "LayoutRules", "MeshSpec"]
