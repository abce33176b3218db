"""How many cross-worker collectives one training step of `fit` runs (tfdist.MultiWorkerMirroredStrategy).

Counted by the strategy's own collective clock (`tfdist/watchdog/clock.py`,
which brackets every collective TF's launchers create), read after each
step of an 8-step `fit` on 2 workers (a callback; the read waits for the
step), so each difference is one step's collectives. Today: the gradients'
(one per bucket: the test model's fit in one), and those of the values
Keras reduces for its logs: Keras 3's are packed into one by tfdist;
tf-keras's step runs six more (measured on this test model, whose logs are
its loss and accuracy; which value each one reduces is not yet traced).

The aim is one collective per step under both front ends (the logged
values riding with the gradients' last bucket); this test pins today's
count, so that the change shows and a step that gains a collective fails.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import absltest

import tfdist
from tests.front_end import KERAS_3
from tfdist.testing import run_local_cluster

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

GRADIENT_BUCKETS = 1  # small_classifier's gradients: a few hundred bytes, one bucket.
LOG_COLLECTIVES = 1 if KERAS_3 else 6


def collectives_per_step() -> list[int]:
    """In each task: the collectives started by each training step of `fit` after the first."""
    keras = tf.keras
    strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=60)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(640, 8)).astype("float32")
    y = rng.integers(0, 3, 640).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat()
    with strategy.scope():
        model = tfdist.testing.small_classifier(keras.optimizers.SGD(0.1))
    clock = strategy._watchdog._clock  # noqa: SLF001 - the strategy's own count.
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(clock.counts()[0]))
    model.fit(dataset, epochs=1, steps_per_epoch=8, verbose=0, callbacks=[record])
    return [b - a for a, b in zip(seen, seen[1:])]


class CollectivesPerStepTest(absltest.TestCase):

    def test_a_step_runs_the_gradient_buckets_and_the_logs_collectives(self):
        counts = run_local_cluster(collectives_per_step, num_workers=2, timeout_s=150)
        for per_step in counts:
            self.assertEqual(per_step, [GRADIENT_BUCKETS + LOG_COLLECTIVES] * 7)


if __name__ == "__main__":
    tfdist.testing.main()
