"""LayerPlacementStrategy on GPUs: stages on /GPU:i, training equal to one device.

Skipped, with the reason, where TensorFlow sees too few GPUs (this project's
CI machine has none). TensorFloat-32 is turned off so that GPU matrix
products round as float32 does, as on the one-device reference (which runs
on TF's default device, GPU:0).
"""

# bazel: size=medium tags=gpu,slow

from __future__ import annotations

import unittest

import pytest
import tensorflow as tf

import tfdist
from tfdist._internal import keras_layers
from tfdist.testing import numerics
from tests.numerics import placement_cases

pytestmark = [pytest.mark.model, pytest.mark.gpu]
keras = tf.keras
NUM_GPUS = len(tf.config.list_physical_devices("GPU"))


class Float32GpuTestCase(tf.test.TestCase):
    """GPU matrix products round as float32 does (TensorFloat-32 off) for each test."""

    def setUp(self):
        super().setUp()
        tf.config.experimental.enable_tensor_float_32_execution(False)
        self.addCleanup(tf.config.experimental.enable_tensor_float_32_execution, True)


class LayerPlacementGpuTest(Float32GpuTestCase):

    @unittest.skipIf(NUM_GPUS < 2, f"needs 2 GPUs; TensorFlow sees {NUM_GPUS}")
    def test_default_devices_are_the_gpus_and_fit_matches_one_device(self):
        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(num_microbatches=2)
        self.assertEqual(strategy.devices, tuple(f"/device:GPU:{i}" for i in range(NUM_GPUS)))
        strategy = tfdist.LayerPlacementStrategy(["/gpu:0", "/gpu:1"], num_microbatches=2)
        numerics.assert_matches_single_device(
            placement_cases.mlp_builder("adam"), strategy, x, y,
            global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL,
        )
        self.assertEqual(
            [stage.device for stage in strategy.placement_plan().stages],
            ["/device:GPU:0", "/device:GPU:1"],
        )

    @unittest.skipIf(NUM_GPUS < 1, "needs a GPU; TensorFlow sees none")
    def test_stages_on_a_gpu_and_a_cpu_match_one_device(self):
        x, y = placement_cases.data()
        def build():
            keras.utils.set_random_seed(1)
            return placement_cases.compiled(
                keras.Sequential(
                    [keras.Input((8,))]
                    + [keras.layers.Dense(16, activation="relu", name=f"g{i}") for i in range(4)]
                    + [keras.layers.Dense(3, name="g4")]
                ),
                "sgd",
            )

        # g0-g2 on the GPU, g3 and g4 (following g3) on a CPU.
        assignment = {"g0": "/gpu:0", "g3": "/cpu:1"}
        strategy = tfdist.LayerPlacementStrategy(placement=assignment, num_microbatches=4)
        with strategy.scope():
            model = build()
        reference = build()
        model.set_weights(reference.get_weights())
        for trained in (model, reference):
            trained.fit(x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
                        shuffle=False, verbose=0)
        numerics.assert_weights_close(
            model, reference, rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL
        )
        devices = {
            layer.name: {tf.DeviceSpec.from_string(v.device).device_type
                         for v in keras_layers.resource_variables(layer)}
            for layer in model.layers
        }
        self.assertEqual(devices["g0"], {"GPU"})
        self.assertEqual(devices["g4"], {"CPU"})


if __name__ == "__main__":
    tfdist.testing.main()
