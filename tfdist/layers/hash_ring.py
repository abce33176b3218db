"""Consistent hashing of table rows onto shards (pure NumPy, no TensorFlow).

Each shard owns `virtual_nodes` points on a 64-bit ring; a row goes to the
shard of the first point at or after the row's own hash (wrapping). Adding
a shard adds its points only, so the rows that move are exactly those the
new shard now owns, about 1/(n + 1) of them, and each moves to the new
shard; removing one moves only its rows. Placement by row ranges moves
about half of all rows when 2 shards become 3.

    ring = HashRing(num_shards=2)
    shard, local = ring.assign(num_rows=1_000_000)   # per row: owner, row in its shard
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfdist import _validation as validation

__all__ = ["DEFAULT_VIRTUAL_NODES", "HashRing"]

#: Points per shard: more even shard sizes for more (host-side) work.
DEFAULT_VIRTUAL_NODES = 256

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a well-spread, deterministic 64-bit hash of uint64s."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & _MASK


@dataclasses.dataclass(frozen=True)
class HashRing:
    """Shards on a consistent-hash ring.

    Attributes:
      num_shards: Shards (>= 1), typically one per ps task.
      virtual_nodes: Points per shard on the ring (>= 1).
    """

    num_shards: int
    virtual_nodes: int = DEFAULT_VIRTUAL_NODES

    def __post_init__(self) -> None:
        validation.check_positive_int("num_shards", self.num_shards)
        validation.check_positive_int("virtual_nodes", self.virtual_nodes)

    def owners(self, rows: np.ndarray) -> np.ndarray:
        """The shard owning each row id (int32, same shape as `rows`)."""
        shard_ids = np.repeat(np.arange(self.num_shards, dtype=np.uint64), self.virtual_nodes)
        node_ids = np.tile(np.arange(self.virtual_nodes, dtype=np.uint64), self.num_shards)
        # A node's point depends on (shard, node) only: adding shards keeps old points.
        points = _mix64(_mix64(shard_ids) ^ node_ids)
        order = np.argsort(points, kind="stable")
        points, owners = points[order], shard_ids[order].astype(np.int32)
        positions = _mix64(np.asarray(rows, dtype=np.int64).view(np.uint64) ^ np.uint64(0x5BD1E995))
        index = np.searchsorted(points, positions, side="left") % len(points)
        return owners[index]

    def assign(self, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(owner shard, row within that shard) of rows 0..num_rows-1, in row order within a shard."""
        owners = self.owners(np.arange(num_rows, dtype=np.int64))
        local = np.zeros(num_rows, dtype=np.int64)
        for shard in range(self.num_shards):
            mine = owners == shard
            local[mine] = np.arange(int(mine.sum()))
        return owners, local
