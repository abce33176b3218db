"""tfdist.LayerPlacementStrategy through model.fit equals one-device training.

Stages over 2 and 4 logical CPUs, M in {1, 2, 4} microbatches, SGD (with
momentum) and Adam, on a 5-layer MLP with uneven microbatches (batches of
30 rows: 8/8/7/7 for M = 4) and a last partial batch; loss and accuracy
histories match too. Other models and steps: layer_placement_models_test.py.
Runs under Keras 3 and,
with TF_USE_LEGACY_KERAS=1, under tf-keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist._internal import keras_layers
from tfdist.testing import numerics
from tests.numerics import placement_cases

pytestmark = pytest.mark.model
keras = tf.keras

def _grid():
    for stages in (2, 4):
        for m in (1, 2, 4):
            for optimizer in ("sgd", "adam"):
                yield {
                    "testcase_name": f"{stages}stages_{m}microbatches_{optimizer}",
                    "num_stages": stages,
                    "num_microbatches": m,
                    "optimizer": optimizer,
                }


def _kernel_devices(model):
    return {v.device for v in keras_layers.resource_variables(model) if v.trainable}


class LayerPlacementFitEquivalenceTest(tf.test.TestCase, parameterized.TestCase):
    """Each case against one single-device run per optimizer (trained once)."""

    _references: dict = {}

    def _reference(self, optimizer):
        if optimizer not in self._references:
            x, y = placement_cases.data()
            model = placement_cases.mlp_builder(optimizer)()
            initial = [np.copy(w) for w in model.get_weights()]
            history = model.fit(
                x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0
            )
            self._references[optimizer] = (model, initial, history.history)
        return self._references[optimizer]

    @parameterized.named_parameters(*_grid())
    def test_fit_matches_single_device(self, num_stages, num_microbatches, optimizer):
        x, y = placement_cases.data()
        reference, initial, reference_history = self._reference(optimizer)
        strategy = tfdist.LayerPlacementStrategy(
            placement_cases.DEVICES[:num_stages], num_microbatches=num_microbatches
        )
        with strategy.scope():
            model = placement_cases.mlp_builder(optimizer)()
        model.set_weights(initial)
        history = model.fit(
            x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0
        )
        numerics.assert_weights_close(model, reference, rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL)
        for name in ("loss", "accuracy"):
            self.assertAllClose(
                history.history[name], reference_history[name],
                rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL,
            )
        self.assertEqual(strategy.placement_plan().num_stages, num_stages)
        self.assertLen(_kernel_devices(model), num_stages)


if __name__ == "__main__":
    tfdist.testing.main()
