"""Layer placement plans, in pure Python: which layers run on which device.

`tfdist.LayerPlacementStrategy` measures a model (`LayerGraph`: each
top-level layer's weights, FLOPs or time, and the activations between
layers) and asks this package for stages (`plan_stages` for
`placement="balanced"`, `plan_from_assignment` for a `{layer: device}`
map). Nothing here imports TensorFlow, so plans can be computed and tested
for fake devices.
"""

from __future__ import annotations

from tfdist.placement.plan import BALANCE_BY
from tfdist.placement.plan import ActivationEdge
from tfdist.placement.plan import LayerGraph
from tfdist.placement.plan import LayerProfile
from tfdist.placement.plan import PlacementPlan
from tfdist.placement.plan import Stage
from tfdist.placement.plan import bubble_fraction
from tfdist.placement.plan import ideal_speedup
from tfdist.placement.plan import plan_from_assignment
from tfdist.placement.plan import plan_stages
from tfdist.placement.report import PlacementReport

__all__ = [
    "BALANCE_BY",
    "ActivationEdge",
    "LayerGraph",
    "LayerProfile",
    "PlacementPlan",
    "PlacementReport",
    "Stage",
    "bubble_fraction",
    "ideal_speedup",
    "plan_from_assignment",
    "plan_stages",
]
