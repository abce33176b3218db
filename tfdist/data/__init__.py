"""The dataset sharders: each example exactly once per epoch, on every layout.

Public API: `shard` (unbatched data or files; tfdist-computed per-epoch
reshuffling), `split_batches` (an already-batched dataset, split over
replicas exactly; what tfdist strategies do with a plain dataset),
`ShardOptions` (a strategy's plain-dataset input through `shard`),
`ShardPolicy`, `Remainder`, `DEFAULT_MAX_IN_MEMORY_BYTES`.

    def dataset_fn(input_context):
        return tfdist.data.shard(
            dataset, input_context, global_batch_size=64, seed=0)

    dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
"""

from __future__ import annotations

from tfdist.data.options import ShardOptions
from tfdist.data.policies import DEFAULT_MAX_IN_MEMORY_BYTES
from tfdist.data.policies import Remainder
from tfdist.data.policies import ShardPolicy
from tfdist.data.sharding import shard
from tfdist.data.splitting import split_batches

__all__ = [
    "DEFAULT_MAX_IN_MEMORY_BYTES",
    "Remainder",
    "ShardOptions",
    "ShardPolicy",
    "shard",
    "split_batches",
]
