"""The strategies users construct: tf.distribute subclasses that Keras finds."""

from __future__ import annotations

from tfdist.strategies.layer_placement import LayerPlacementStrategy
from tfdist.strategies.mirrored import MirroredStrategy
from tfdist.strategies.multi_worker import MultiWorkerMirroredStrategy
from tfdist.strategies.parameter_server import ParameterServerStrategy

__all__ = [
    "LayerPlacementStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
]
