"""The consistent-hash ring: balanced shards, and growing moves only what the new shard takes."""

from __future__ import annotations

import numpy as np
from absl.testing import absltest

from tfdist import errors
from tfdist.layers import hash_ring

ROWS = 200_000


class HashRingTest(absltest.TestCase):

    def test_shards_are_balanced_within_ten_percent(self):
        for shards in (2, 3, 5):
            owners, _ = hash_ring.HashRing(shards).assign(ROWS)
            counts = np.bincount(owners, minlength=shards)
            np.testing.assert_allclose(counts, ROWS / shards, rtol=0.1, err_msg=str(counts))

    def test_a_new_shard_takes_rows_only_for_itself(self):
        before, _ = hash_ring.HashRing(2).assign(ROWS)
        after, _ = hash_ring.HashRing(3).assign(ROWS)
        moved = before != after
        self.assertTrue(np.all(after[moved] == 2))  # Every moved row went to the new shard.
        # The new shard's share, and no more (TF's row-range partitioners
        # move about half of the rows from 2 shards to 3).
        self.assertAlmostEqual(moved.mean(), 1 / 3, delta=0.05)

    def test_assignment_is_deterministic_and_rows_keep_their_order_in_a_shard(self):
        owners, local = hash_ring.HashRing(3).assign(1000)
        again, _ = hash_ring.HashRing(3).assign(1000)
        np.testing.assert_array_equal(owners, again)
        for shard in range(3):
            np.testing.assert_array_equal(
                local[owners == shard], np.arange(np.count_nonzero(owners == shard))
            )

    def test_no_shards_raises_config_error_naming_it(self):
        with self.assertRaisesRegex(errors.ConfigError, "num_shards=0"):
            hash_ring.HashRing(0)


if __name__ == "__main__":
    absltest.main()
