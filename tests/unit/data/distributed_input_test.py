"""tfdist.data.shard behind TF's own MirroredStrategy on logical CPUs.

`strategy.distribute_datasets_from_function` hands consecutive batches of
the one input pipeline to the replicas in order; each replica must receive
exactly the shard the sharder's documented rule gives it. Without shuffling
that rule is written out here by hand: step k, replica r gets positions
k*B + r*b .. k*B + r*b + b - 1, and the last step's M real examples are
split as evenly as possible, the first replicas taking one more.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist.data import sharding

_NUM_ELEMENTS = 22
_GLOBAL_BATCH_SIZE = 8


def _dataset() -> tf.data.Dataset:
    ids = np.arange(_NUM_ELEMENTS, dtype=np.int64)
    return tf.data.Dataset.from_tensor_slices((ids, ids * 10))


def _make_dataset_fn(**kwargs: Any) -> Any:
    def dataset_fn(input_context: tf.distribute.InputContext) -> Any:
        return sharding.shard(
            _dataset(),
            input_context,
            global_batch_size=_GLOBAL_BATCH_SIZE,
            seed=5,
            **kwargs,
        )

    return dataset_fn


def _expected_replica_batches(num_replicas: int, epoch: int) -> list[Any]:
    """expected[k][r]: the batch replica r must see at step k."""
    batches = list(
        sharding.shard(
            _dataset(),
            tf.distribute.InputContext(1, 0, num_replicas),
            global_batch_size=_GLOBAL_BATCH_SIZE,
            seed=5,
            epoch=epoch,
        ).as_numpy_iterator()
    )
    return [
        batches[k : k + num_replicas]
        for k in range(0, len(batches), num_replicas)
    ]


def _received(strategy: tf.distribute.Strategy, dist_dataset: Any) -> list[Any]:
    """One pass over a distributed dataset: received[k][r] as numpy."""
    return [
        [
            tuple(t.numpy() for t in replica_batch)
            for replica_batch in zip(
                *(strategy.experimental_local_results(t) for t in step)
            )
        ]
        for step in dist_dataset
    ]


_STRATEGIES = (
    dict(testcase_name="mirrored_2cpu", num_replicas=2),
    dict(testcase_name="mirrored_4cpu", num_replicas=4),
)


class MirroredStrategyTest(tf.test.TestCase, parameterized.TestCase):
    def _strategy(self, num_replicas: int) -> tf.distribute.Strategy:
        return tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(num_replicas)]
        )

    @parameterized.named_parameters(*_STRATEGIES)
    def test_each_replica_receives_its_shard(self, num_replicas):
        strategy = self._strategy(num_replicas)
        dist_dataset = strategy.distribute_datasets_from_function(
            _make_dataset_fn(shuffle=False)
        )
        received = _received(strategy, dist_dataset)
        per_replica = _GLOBAL_BATCH_SIZE // num_replicas
        tail = _NUM_ELEMENTS % _GLOBAL_BATCH_SIZE  # 6 real examples.
        tail_sizes = [
            tail // num_replicas + (r < tail % num_replicas) for r in range(num_replicas)
        ]
        expected_ids = [
            [list(range(k * _GLOBAL_BATCH_SIZE + r * per_replica,
                        k * _GLOBAL_BATCH_SIZE + (r + 1) * per_replica))
             for r in range(num_replicas)]
            for k in range(_NUM_ELEMENTS // _GLOBAL_BATCH_SIZE)
        ] + [
            [list(range(16 + sum(tail_sizes[:r]), 16 + sum(tail_sizes[: r + 1])))
             for r in range(num_replicas)]
        ]
        self.assertLen(received, len(expected_ids))
        for got_step, want_step in zip(received, expected_ids):
            for (ids, targets, weights), want in zip(got_step, want_step):
                real = weights != 0
                self.assertEqual(ids[real].tolist(), want)
                self.assertEqual(targets[real].tolist(), [10 * i for i in want])
                self.assertLen(ids, per_replica)
        # 22 examples in steps of 8: the last step's 6 real examples are
        # weighted 8 / 6, so every step's weights sum to the global batch.
        for step in received:
            self.assertAllClose(
                sum(float(b[2].sum()) for b in step),
                _GLOBAL_BATCH_SIZE,
                rtol=1e-6,
            )
        real = np.concatenate([b[2] for b in received[-1]])
        self.assertAllEqual(
            real[real != 0], np.full([6], np.float32(8) / np.float32(6))
        )

    @parameterized.named_parameters(*_STRATEGIES)
    def test_second_pass_is_next_epoch_when_built_in_scope(self, num_replicas):
        strategy = self._strategy(num_replicas)
        with strategy.scope():  # The epoch counter must not be mirrored.
            dist_dataset = strategy.distribute_datasets_from_function(
                _make_dataset_fn()
            )
        _received(strategy, dist_dataset)
        second = _received(strategy, dist_dataset)
        expected = _expected_replica_batches(num_replicas, epoch=1)
        self.assertLen(second, len(expected))
        for got_step, expected_step in zip(second, expected):
            for got, want in zip(got_step, expected_step):
                self.assertAllEqual(got, want)


if __name__ == "__main__":
    tfdist.testing.main()
