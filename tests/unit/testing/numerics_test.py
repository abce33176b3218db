"""tfdist.testing.assert_weights_close, max_weight_difference and shared one-device references."""

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


class SharedReferenceTest(tf.test.TestCase):

    def _data(self, rows=16):
        rng = np.random.default_rng(0)
        return (rng.normal(size=(rows, 8)).astype("float32"),
                rng.integers(0, 3, rows).astype("int32"))

    def _build(self):
        return tfdist.testing.small_classifier(keras.optimizers.SGD(0.1))

    def test_a_shared_reference_gives_what_a_fresh_one_gives(self):
        x, y = self._data()
        reference = numerics.train_single_device(
            self._build, x, y, global_batch_size=8, epochs=1)
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        fresh = numerics.assert_matches_single_device(
            self._build, strategy, x, y, global_batch_size=8, epochs=1, rtol=0, atol=0,
            check_inference=False)
        shared = numerics.assert_matches_single_device(
            self._build, strategy, x, y, global_batch_size=8, epochs=1, rtol=0, atol=0,
            check_inference=False, reference=reference)
        self.assertIs(shared.single_device_model, reference.model)
        self.assertEqual(shared.single_device_history, fresh.single_device_history)
        numerics.assert_weights_close(
            shared.distributed_model, fresh.distributed_model, rtol=0, atol=0)

    def test_a_reference_of_other_arguments_raises_config_error(self):
        x, y = self._data()
        reference = numerics.train_single_device(
            self._build, x, y, global_batch_size=8, epochs=1)
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        for name, arguments in (
            ("epochs", dict(x=x, y=y, global_batch_size=8, epochs=2)),
            ("batch", dict(x=x, y=y, global_batch_size=4, epochs=1)),
            ("data", dict(x=x + 1, y=y, global_batch_size=8, epochs=1)),
        ):
            with self.subTest(changed=name), self.assertRaisesRegex(
                errors.ConfigError, r"reference= was trained with other fit arguments.*"
                r"received global_batch_size=\d+, epochs=\d+"):
                numerics.assert_matches_single_device(
                    self._build, strategy, rtol=0, atol=0, reference=reference, **arguments)


if __name__ == "__main__":
    tfdist.testing.main()
