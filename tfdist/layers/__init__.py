"""Keras layers for tables on parameter servers.

- `ConsistentHashEmbedding`: an `Embedding` whose rows are spread over
  shards (one per ps task) by consistent hashing: adding a shard moves only
  the rows it takes over.
- `hash_ring`: the ring itself (pure NumPy).
"""

from __future__ import annotations

from tfdist.layers.consistent_hash_embedding import ConsistentHashEmbedding

__all__ = ["ConsistentHashEmbedding"]
