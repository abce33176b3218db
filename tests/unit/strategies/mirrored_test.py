"""tfdist.MirroredStrategy construction, validation and the update-once path."""

from __future__ import annotations

import numpy as np
from absl.testing import parameterized
import pytest
import tensorflow as tf

import tfdist
from tfdist import errors

keras = tf.keras
DEVICES = [f"/cpu:{i}" for i in range(4)]


class ConstructionTest(tf.test.TestCase, parameterized.TestCase):

    def test_default_devices_are_the_four_logical_cpus(self):
        strategy = tfdist.MirroredStrategy()
        self.assertEqual(strategy.num_replicas_in_sync, 4)
        self.assertIsInstance(strategy, tf.distribute.MirroredStrategy)

    def test_cpu_devices_default_to_update_once_and_reduce_only(self):
        strategy = tfdist.MirroredStrategy(DEVICES[:2])
        self.assertTrue(strategy.update_once_on_host)
        self.assertEqual(strategy.cross_device_ops.results_needed, "first")

    def test_single_device_does_not_use_update_once(self):
        strategy = tfdist.MirroredStrategy(DEVICES[:1])
        self.assertFalse(strategy.update_once_on_host)
        self.assertEqual(strategy.cross_device_ops.results_needed, "all")

    @parameterized.named_parameters(
        {"testcase_name": "unknown_algorithm", "kwargs": {"all_reduce": "allgather"},
         "error": errors.ConfigError, "text": "allgather"},
        {"testcase_name": "zero_bucket", "kwargs": {"bucket_bytes": 0},
         "error": errors.ConfigError, "text": "bucket_bytes=0"},
        {"testcase_name": "duplicate_devices", "kwargs": {"devices": ["/cpu:0", "/device:CPU:0"]},
         "error": errors.DeviceConfigError, "text": "more than once"},
        {"testcase_name": "missing_device", "kwargs": {"devices": ["/cpu:0", "/cpu:9"]},
         "error": errors.DeviceConfigError, "text": "CPU:9"},
        {"testcase_name": "empty_devices", "kwargs": {"devices": []},
         "error": errors.DeviceConfigError, "text": "empty"},
        {"testcase_name": "unparseable_device", "kwargs": {"devices": ["cpu zero"]},
         "error": errors.DeviceConfigError, "text": "cpu zero"},
        {"testcase_name": "string_devices", "kwargs": {"devices": "/cpu:0"},
         "error": TypeError, "text": "Wrap it in a list"},
        {"testcase_name": "bad_compression", "kwargs": {"compression": "fp8"},
         "error": errors.ConfigError, "text": "fp8"},
    )
    def test_bad_argument_raises_clear_error(self, kwargs, error, text):
        with self.assertRaisesRegex(error, text):
            tfdist.MirroredStrategy(**kwargs)


class TfConstructorArgumentsTest(tf.test.TestCase, parameterized.TestCase):
    """`tf.distribute.MirroredStrategy(devices, cross_device_ops)` as TF's guide writes it."""

    def test_tf_cross_device_ops_is_used_for_gradients(self):
        ops = tf.distribute.HierarchicalCopyAllReduce()
        strategy = tfdist.MirroredStrategy(DEVICES, cross_device_ops=ops)
        self.assertIs(strategy.cross_device_ops, ops)
        self.assertIs(strategy.extended._cross_device_ops, ops)

    def test_tfdist_all_reduce_is_taken_with_its_settings(self):
        strategy = tfdist.MirroredStrategy(
            DEVICES, tfdist.AllReduce("ring", bucket_bytes=1 << 10, compression="fp16")
        )
        ops = strategy.cross_device_ops
        self.assertEqual(
            (ops.algorithm, ops.bucket_bytes, ops.compression.value),
            ("ring", 1 << 10, "fp16"),
        )

    def test_fit_with_tf_cross_device_ops_matches_tfdist_default(self):
        default = _fit(tfdist.MirroredStrategy(DEVICES))
        with_tf_ops = _fit(
            tfdist.MirroredStrategy(DEVICES, tf.distribute.HierarchicalCopyAllReduce())
        )
        tfdist.testing.assert_weights_close(with_tf_ops, default, rtol=1e-5, atol=1e-6)

    @parameterized.named_parameters(
        {"testcase_name": "all_reduce", "kwargs": {"all_reduce": "ring"}, "text": "all_reduce='ring'"},
        {"testcase_name": "bucket_bytes", "kwargs": {"bucket_bytes": 64}, "text": "bucket_bytes=64"},
        {"testcase_name": "compression", "kwargs": {"compression": "bf16"}, "text": "compression='bf16'"},
    )
    def test_cross_device_ops_with_tfdist_settings_is_refused(self, kwargs, text):
        with self.assertRaisesRegex(errors.ConfigError, text):
            tfdist.MirroredStrategy(
                DEVICES, cross_device_ops=tf.distribute.ReductionToOneDevice(), **kwargs
            )

    def test_cross_device_ops_of_the_wrong_type_is_refused(self):
        with self.assertRaisesRegex(TypeError, "cross_device_ops='ring'"):
            tfdist.MirroredStrategy(DEVICES, cross_device_ops="ring")


def _fit(strategy):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = rng.integers(0, 2, 64).astype("int32")
    with strategy.scope():
        keras.utils.set_random_seed(5)
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
             keras.layers.Dense(2)]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return model


@pytest.mark.model
class UpdateOnceTest(tf.test.TestCase):

    def test_update_once_is_bit_identical_to_updating_every_device(self):
        # A fixed algorithm, so both runs add gradients in the same order.
        once = _fit(tfdist.MirroredStrategy(
            DEVICES, all_reduce="tree", update_once_on_host=True))
        every = _fit(tfdist.MirroredStrategy(
            DEVICES, all_reduce="tree", update_once_on_host=False))
        for a, b in zip(once.get_weights(), every.get_weights()):
            self.assertAllEqual(a, b)

    def test_every_device_copy_equals_the_first_after_fit(self):
        model = _fit(tfdist.MirroredStrategy(DEVICES, update_once_on_host=True))
        for variable in model.trainable_variables:
            components = _components(model, variable)
            self.assertLen(components, 4)
            for component in components[1:]:
                self.assertAllEqual(component, components[0])

    def test_update_once_updates_optimizer_slots_only_on_the_first_device(self):
        # Keras passes all-reduced gradients to the update as per-replica
        # values; this proves they are applied once (on the first device's
        # copy of every Adam slot), not once per device.
        model = _fit(tfdist.MirroredStrategy(DEVICES, update_once_on_host=True))
        for first, *others in self._first_moment_copies(model):
            self.assertGreater(np.abs(first).max(), 0.0)
            for other in others:
                self.assertAllEqual(other, np.zeros_like(first))

    def test_per_device_updates_without_update_once(self):
        model = _fit(tfdist.MirroredStrategy(DEVICES, update_once_on_host=False))
        for first, *others in self._first_moment_copies(model):
            for other in others:
                self.assertAllEqual(other, first)

    def _first_moment_copies(self, model):
        """Per-device values of each Adam first-moment slot (at least one)."""
        slots = _first_moments(model.optimizer)
        self.assertNotEmpty(slots)
        return [_components(model, slot) for slot in slots]


def _first_moments(optimizer):
    """Adam's first-moment slots (Keras 3: ".../kernel_momentum"; tf-keras:
    "Adam/m/...")."""
    return [
        v for v in optimizer.variables
        if "momentum" in getattr(v, "path", "") or "/m/" in v.name
    ]


def _components(model, variable):
    """Per-device values of a Keras 3 or tf-keras model/optimizer variable."""
    # Keras 3 wraps the tf.Variable (property `.value`); tf-keras's variable
    # is the tf.Variable (`.value` is a method).
    mirrored = variable if callable(variable.value) else variable.value
    return [
        c.numpy() for c in model.distribute_strategy.experimental_local_results(mirrored)
    ]


if __name__ == "__main__":
    tfdist.testing.main()
