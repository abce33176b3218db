"""Sync parameter-server training through every update path and the common optimizers, as one device.

The optimizer matrix of tests/numerics/optimizer_matrix_fit_test.py (a
token and a position embedding, so sparse gradients of batch-derived and
of constant indices, and a Dense layer), under
`tfdist.ParameterServerStrategy(mode="sync")` with 2 workers and 2 ps
tasks in one forked task: Adam through each way a `train_step` applies
gradients (Keras's step, `apply_gradients`, a `LossScaleOptimizer`, Keras
3's `apply`), and SGD with momentum, AdamW, Adagrad and RMSprop through
Keras's step. Each `fit` must train one device's weights to float32
rounding. Keras 3 and tf-keras.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tfdist
from tests.numerics import optimizer_matrix_fit_test as matrix
from tests.numerics import position_embedding_fit_test as position
from tfdist.testing import numerics

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]
keras = tf.keras
CLUSTER_TIMEOUT_S = 300

CASES = {
    **{f"adam_{update}": (update, lambda: keras.optimizers.Adam(0.01)) for update in matrix.UPDATES},
    **{f"{name}_keras_step": ("keras_step", make) for name, make in matrix.OPTIMIZERS.items()},
}


def compare_all() -> dict[str, str | None]:
    """In the task: each case's mismatch with one device (None where it matches)."""
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    strategy = tfdist.ParameterServerStrategy(config, mode="sync", timeout_s=120)
    x, y = position._data()
    found: dict[str, str | None] = {}
    for name, (update, make_optimizer) in CASES.items():
        try:
            numerics.assert_matches_single_device(
                matrix._builder(update, make_optimizer), strategy, x, y,
                global_batch_size=position.GLOBAL_BATCH_SIZE, epochs=1,
                rtol=matrix.RTOL, atol=matrix.ATOL, check_inference=False)
            found[name] = None
        except Exception as e:  # noqa: BLE001 - reported to the test.
            found[name] = f"{type(e).__name__}: {e}"
    return found


class SyncOptimizerMatrixTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.found,) = tfdist.testing.run_local_cluster(
            compare_all, num_workers=1, timeout_s=CLUSTER_TIMEOUT_S)

    def test_every_update_path_and_optimizer_equals_one_device(self):
        self.assertEqual(sorted(self.found), sorted(CASES))
        for name, mismatch in self.found.items():
            with self.subTest(name):
                self.assertIsNone(mismatch)


if __name__ == "__main__":
    tfdist.testing.main()
