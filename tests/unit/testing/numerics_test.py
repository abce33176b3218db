"""tfdist.testing.assert_weights_close and max_weight_difference."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfdist
from tfdist import errors
from tfdist.testing import numerics

keras = tf.keras


def _model(units=3):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((2,)), keras.layers.Dense(4, name="hidden"),
         keras.layers.Dense(units, name="head")]
    )


class AssertWeightsCloseTest(tf.test.TestCase):

    def test_identical_models_pass(self):
        a, b = _model(), _model()
        numerics.assert_weights_close(a, b, rtol=0, atol=0)
        self.assertEqual(numerics.max_weight_difference(a, b)[1], 0.0)

    def test_failure_names_the_worst_variable_and_its_difference(self):
        a, b = _model(), _model()
        weights = b.get_weights()
        weights[2] = weights[2] + 0.5   # head kernel: the worst
        weights[0] = weights[0] + 1e-3  # hidden kernel: also off, less so
        b.set_weights(weights)
        with self.assertRaisesRegex(
            AssertionError, r"2 weight\(s\) differ.*worst is '.*head.*kernel.*' with max \|a - b\| = 0\.5"
        ):
            numerics.assert_weights_close(a, b, rtol=0, atol=1e-6)
        name, diff = numerics.max_weight_difference(a, b)
        self.assertIn("head", name)
        self.assertAlmostEqual(diff, 0.5, places=6)

    def test_difference_within_tolerance_passes(self):
        a, b = _model(), _model()
        b.set_weights([w + 1e-7 for w in b.get_weights()])
        numerics.assert_weights_close(a, b, rtol=0, atol=1e-6)

    def test_models_of_different_structure_raise_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, "shape"):
            numerics.assert_weights_close(_model(3), _model(5), rtol=0, atol=0)


if __name__ == "__main__":
    tfdist.testing.main()
