"""tfdist: custom tf.distribute strategies behind the standard Keras `fit`.

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
"""

from __future__ import annotations

from tfdist import cluster
from tfdist import collectives
from tfdist import data
from tfdist import errors
from tfdist import placement
from tfdist import testing
from tfdist.collectives import AllReduce
from tfdist.collectives import AutoAllReduce
from tfdist.collectives import ReduceToOneAllReduce
from tfdist.collectives import RingAllReduce
from tfdist.collectives import TreeAllReduce
from tfdist.devices import local_devices
from tfdist.devices import simulate_cpu_devices
from tfdist.strategies import LayerPlacementStrategy
from tfdist.strategies import MirroredStrategy
from tfdist.strategies import MultiWorkerMirroredStrategy

__all__ = [
    "AllReduce",
    "AutoAllReduce",
    "LayerPlacementStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "ReduceToOneAllReduce",
    "RingAllReduce",
    "TreeAllReduce",
    "cluster",
    "collectives",
    "data",
    "errors",
    "local_devices",
    "placement",
    "simulate_cpu_devices",
    "testing",
]

__version__ = "0.1.0"
