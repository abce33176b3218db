"""Model parallelism between layers: `tfdist.LayerPlacementStrategy` and its planner.

Modules, one job each:

- `plan`, `report` (the public `tfdist.placement` API, pure Python): which
  layers run on which device. The strategy measures a model (`LayerGraph`:
  each top-level layer's weights, FLOPs or time, and the activations
  between layers) and asks for stages (`plan_stages` for
  `placement="balanced"`, `plan_from_assignment` for a `{layer: device}`
  map). They import no TensorFlow, so plans can be computed and tested for
  fake devices, and `import tfdist.placement` loads none.
- `strategy`: the strategy class (imported by `tfdist.LayerPlacementStrategy`,
  not by this package);
- `_extended`: its `StrategyExtended` (where variables and ops go), over
  TF's one-replica contract in `tfdist/_internal/single_replica.py`;
- `_layer_trace`: one forward pass traced layer by layer;
- `_layer_profile`: measuring a model's layers for the planner;
- `_microbatch`: a step run once per microbatch with one optimizer update.

The Keras names it needs (a weight's storage, wrapping a layer's calls) are
adapters in `tfdist/_internal/keras_layers.py`.
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
