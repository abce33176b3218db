"""tfdist: custom tf.distribute strategies behind the standard Keras `fit`.

Usage::

    import tfdist
    strategy = tfdist.MirroredStrategy()   # or LayerPlacementStrategy(num_microbatches=4)
    with strategy.scope():
        model = build_model()
        model.compile(...)
    model.fit(dataset, epochs=3)

Glossary (the words every tfdist docstring uses, as in `tf.distribute`):

- **replica**: one copy of the model's computation; `num_replicas_in_sync`
  replicas run each step together.
- **worker**: a process (task) that runs replicas on its local devices.
- **task**: one process of a cluster, named by `task_type` ("chief",
  "worker", "ps", "evaluator") and `task_id` (its index in that job).
- **ps**: a parameter-server task that holds variables for workers.
- **stage**: a contiguous group of layers placed on one device
  (layer placement).
- **microbatch**: a slice of a per-replica batch pushed through pipeline
  stages one after another.
- **global batch**: the examples consumed by one training step over all
  replicas (`global_batch_size`); the **per-replica batch** is
  `global_batch_size // num_replicas_in_sync`.

`import tfdist` itself imports nothing: each subpackage and name is imported
on first use, and only those that need TensorFlow import it (`tfdist.errors`,
`tfdist.cluster`, `tfdist.launch` and `tfdist.placement` do not).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:  # What the lazy attributes below resolve to.
    from tfdist import cluster
    from tfdist import collectives
    from tfdist import data
    from tfdist import elastic
    from tfdist import errors
    from tfdist import launch
    from tfdist import layers
    from tfdist import mesh
    from tfdist import placement
    from tfdist import testing
    from tfdist.collectives import AllReduce
    from tfdist.collectives import AutoAllReduce
    from tfdist.collectives import ReduceToOneAllReduce
    from tfdist.collectives import RingAllReduce
    from tfdist.collectives import TreeAllReduce
    from tfdist.devices import local_devices
    from tfdist.devices import simulate_cpu_devices
    from tfdist.placement.strategy import LayerPlacementStrategy
    from tfdist.mesh.strategy import MeshStrategy
    from tfdist.mirrored import MirroredStrategy
    from tfdist.multi_worker import MultiWorkerMirroredStrategy
    from tfdist.parameter_server.strategy import ParameterServerStrategy

__all__ = [
    "AllReduce",
    "AutoAllReduce",
    "LayerPlacementStrategy",
    "MeshStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "ReduceToOneAllReduce",
    "RingAllReduce",
    "TreeAllReduce",
    "cluster",
    "collectives",
    "data",
    "elastic",
    "errors",
    "launch",
    "layers",
    "local_devices",
    "mesh",
    "placement",
    "simulate_cpu_devices",
    "testing",
]

__version__ = "0.1.0"

# The public subpackages, and the module each other public name comes from.
# Nothing is imported until first used (PEP 562), so `import tfdist.cluster`
# or `python -m tfdist.launch` does not wait seconds for TensorFlow.
_SUBPACKAGES = frozenset(
    {"cluster", "collectives", "data", "elastic", "errors", "launch", "layers", "mesh", "placement", "testing"}
)
_ATTRIBUTE_MODULES = {
    "AllReduce": "tfdist.collectives",
    "AutoAllReduce": "tfdist.collectives",
    "ReduceToOneAllReduce": "tfdist.collectives",
    "RingAllReduce": "tfdist.collectives",
    "TreeAllReduce": "tfdist.collectives",
    "local_devices": "tfdist.devices",
    "simulate_cpu_devices": "tfdist.devices",
    "LayerPlacementStrategy": "tfdist.placement.strategy",
    "MeshStrategy": "tfdist.mesh.strategy",
    "MirroredStrategy": "tfdist.mirrored",
    "MultiWorkerMirroredStrategy": "tfdist.multi_worker",
    "ParameterServerStrategy": "tfdist.parameter_server.strategy",
}


def __getattr__(name: str) -> Any:  # Any: each public name has its own type.
    """Imports a public subpackage or name on first access (PEP 562)."""
    if name in _SUBPACKAGES:
        value = importlib.import_module(f"tfdist.{name}")
    elif name in _ATTRIBUTE_MODULES:
        value = getattr(importlib.import_module(_ATTRIBUTE_MODULES[name]), name)
    else:
        raise AttributeError(f"module 'tfdist' has no attribute {name!r}")
    globals()[name] = value  # Later accesses skip __getattr__.
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
