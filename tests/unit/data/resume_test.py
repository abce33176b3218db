"""Where a tfdist distributed dataset's pass starts after `resume.arm` (tfdist.elastic's resumption).

Ids in, ids out: a pass is read on the host as the strategy would, and the
ids each step gave the replicas are compared with the uninterrupted run's.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist.data.distributed import resume

_NUM_EXAMPLES = 36
_BATCH = 8  # 5 steps: 4 full, one of 4.


def _ids_per_step(iterator):
    steps = []
    for x, _ in iterator:
        steps.append(sorted(int(i) for r in x.values for i in r.numpy()))
    return steps


class ResumeTest(tf.test.TestCase, parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.addCleanup(resume.disarm)
        ids = np.arange(_NUM_EXAMPLES, dtype=np.int64)
        self.dataset = tf.data.Dataset.from_tensor_slices((ids, ids)).batch(_BATCH)

    def _distributed(self, shard_options=None):
        strategy = tfdist.MirroredStrategy(["/cpu:0", "/cpu:1"], shard_options=shard_options)
        return strategy.experimental_distribute_dataset(self.dataset)

    @parameterized.named_parameters(
        dict(testcase_name="plain", shard=False),
        dict(testcase_name="sharded", shard=True),
    )
    def test_the_resumed_pass_is_the_rest_of_its_epoch_and_later_passes_follow(self, shard):
        options = tfdist.data.ShardOptions(seed=3, shuffle=True) if shard else None
        reference = self._distributed(options)
        epochs = [_ids_per_step(reference) for _ in range(3)]

        resumed = self._distributed(options)
        iter(resumed)  # Made and never read, as Keras does: takes nothing.
        resume.arm(resume.ResumePoint(epoch=1, step=2))
        unread = iter(resumed)  # Takes the point; the first pass to read starts there.
        del unread
        self.assertFalse(resume.disarm())
        self.assertEqual(_ids_per_step(resumed), epochs[1][2:])
        self.assertEqual(_ids_per_step(resumed), epochs[2] if shard else epochs[0])

    def test_a_sharded_pass_reports_its_epoch_once_it_has_produced(self):
        distributed = self._distributed(tfdist.data.ShardOptions(seed=3, shuffle=True))
        iter(distributed)  # Never read: not an epoch of the sharder's.
        _ids_per_step(distributed)
        self.assertEqual(resume.last_epoch(), 0)
        _ids_per_step(distributed)
        self.assertEqual(resume.last_epoch(), 1)

    def test_a_plain_pass_has_no_epoch(self):
        _ids_per_step(self._distributed())
        self.assertIsNone(resume.last_epoch())


if __name__ == "__main__":
    tf.test.main()
