"""tfdist's collective algorithms, exposed as `tf.distribute.CrossDeviceOps`.

`AllReduce(algorithm)` with `RingAllReduce`, `TreeAllReduce`,
`ReduceToOneAllReduce` and `AutoAllReduce` (cost-model choice per bucket);
gradient bucketing and fp16/bf16 compression are options of each.
Across workers: `cross_worker.HierarchicalAllReduce` (TF's collectives over
gRPC, or `host_memory.HostGroup` through shared memory on one host).
"""

from __future__ import annotations

from tfdist.collectives.cost_model import AlphaBeta
from tfdist.collectives.cost_model import CostModel
from tfdist.collectives.cross_device_ops import DEFAULT_BUCKET_BYTES
from tfdist.collectives.cross_device_ops import AllReduce
from tfdist.collectives.cross_device_ops import AutoAllReduce
from tfdist.collectives.cross_device_ops import Compression
from tfdist.collectives.cross_device_ops import ReduceToOneAllReduce
from tfdist.collectives.cross_device_ops import RingAllReduce
from tfdist.collectives.cross_device_ops import TreeAllReduce

__all__ = [
    "AllReduce",
    "AlphaBeta",
    "AutoAllReduce",
    "Compression",
    "CostModel",
    "DEFAULT_BUCKET_BYTES",
    "ReduceToOneAllReduce",
    "RingAllReduce",
    "TreeAllReduce",
]
