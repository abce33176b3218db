"""MeshStrategy on GPUs: a 1x2 mesh of /GPU:0 and /GPU:1, training equal to one device.

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
from tensorflow.experimental import dtensor

import tfdist
from tfdist._internal import keras_layers
from tfdist.testing import numerics
from tests.numerics import layer_placement_gpu_test
from tests.numerics import mesh_fit_test

pytestmark = [pytest.mark.model, pytest.mark.gpu]
NUM_GPUS = layer_placement_gpu_test.NUM_GPUS


class MeshGpuTest(layer_placement_gpu_test.Float32GpuTestCase):

    @unittest.skipIf(NUM_GPUS < 2, f"needs 2 GPUs; TensorFlow sees {NUM_GPUS}")
    def test_a_split_pair_on_two_gpus_matches_one_device(self):
        x, y = mesh_fit_test._data()
        mesh = tfdist.mesh.DeviceMesh((1, 2), ("batch", "model"), ["gpu:0", "gpu:1"])
        strategy = tfdist.MeshStrategy(mesh, layout_map=mesh_fit_test.MLP_LAYOUT)
        comparison = numerics.assert_matches_single_device(
            mesh_fit_test._mlp("adam"), strategy, x, y,
            global_batch_size=mesh_fit_test.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=mesh_fit_test.FLOAT32_RTOL, atol=mesh_fit_test.FLOAT32_ATOL,
        )
        kernel = keras_layers.storage_variable(comparison.distributed_model.get_layer("up").kernel)
        slices = dtensor.unpack(kernel.read_value())
        self.assertEqual(sorted(s.device.split("device:")[-1] for s in slices), ["GPU:0", "GPU:1"])
        self.assertEqual(slices[0].shape[1] * 2, kernel.shape[1])  # Split by columns.


if __name__ == "__main__":
    tfdist.testing.main()
