"""keras.io's "Distributed training with Keras 3" guide, its ModelParallel part, on TensorFlow through tfdist.

The guide (keras-team/keras-io, guides/distribution.py) runs on JAX only:
Keras's TensorFlow backend ignores `keras.distribution.set_distribution`.
Ported as a TensorFlow user would write it with tfdist: the guide's mesh
(`DeviceMesh` with axes "data" and "model", here (2, 2) over the 4 logical
CPUs), its `LayoutMap` and its model (784 -> Dense(200, relu) "d1" ->
Dense(10, softmax) "d2"), given to `tfdist.MeshStrategy` instead of
`ModelParallel`; synthetic MNIST-shaped data (the guide reads none).

- As written, the guide's keys ("d1/kernel", "d2/output") match no variable
  under Keras's own rule (a key must match the whole path,
  "sequential/d1/kernel"): the guide's model trains unsplit there, and
  tfdist says so (a warning and the layout report) and trains as one device.
- With the keys given a ".*" prefix, d1 is split column-parallel over the
  "model" axis and the batch over "data"; training equals one device.

Keras 3 only: the guide is about Keras 3's distribution API.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import absltest

import tfdist
from tests.front_end import KERAS_3
from tfdist.testing import numerics

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not KERAS_3, reason="the guide is Keras 3's distribution API"),
]
keras = tf.keras

# As mesh_fit_test.py: float32 sums in another order, a few ulps per step.
RTOL, ATOL = 1e-5, 1e-6


def _guide_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.layers.Input(shape=(784,)),
        keras.layers.Dense(200, activation="relu", name="d1"),
        keras.layers.Dense(10, activation="softmax", name="d2"),
    ])
    model.compile(loss="mse", optimizer="adam")  # As the guide compiles it.
    return model


def _strategy(keys):
    mesh = keras.distribution.DeviceMesh(
        shape=(2, 2), axis_names=["data", "model"], devices=[f"cpu:{i}" for i in range(4)]
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[keys["kernel"]] = (None, "model")
    layout_map[keys["bias"]] = ("model",)
    return tfdist.MeshStrategy(mesh, layout_map=layout_map, batch_dim_name="data")


def _data():
    rng = np.random.default_rng(4)
    x = rng.random((96, 784), dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 10, 96), 10)
    return x, y


class KerasDistributionGuideTest(absltest.TestCase):

    def test_the_guides_keys_as_written_match_nothing_and_tfdist_says_so(self):
        x, y = _data()
        strategy = _strategy({"kernel": "d1/kernel", "bias": "d1/bias"})
        with self.assertLogs(level="WARNING") as logs:
            numerics.assert_matches_single_device(
                _guide_model, strategy, x, y, global_batch_size=32, epochs=1,
                rtol=RTOL, atol=ATOL, check_inference=True,
            )
        self.assertTrue(any("matched no variable: ['d1/kernel', 'd1/bias']" in line for line in logs.output))
        report = strategy.layout_report()
        self.assertRegex(report, r"sequential(_\d+)?/d1/kernel \| \(784, 200\) \| \(None, None\)")
        self.assertIn("start them with '.*'", report)

    def test_the_guides_layouts_with_whole_path_keys_split_d1_and_train_as_one_device(self):
        x, y = _data()
        strategy = _strategy({"kernel": ".*d1/kernel", "bias": ".*d1/bias"})
        numerics.assert_matches_single_device(
            _guide_model, strategy, x, y, global_batch_size=32, epochs=2,
            rtol=RTOL, atol=ATOL, check_inference=True,
        )
        report = strategy.layout_report()
        self.assertRegex(report, r"d1/kernel \| \(784, 200\) \| \(None, 'model'\) \| 313600 \|")
        self.assertNotIn("matched no variable", report)


if __name__ == "__main__":
    tfdist.testing.main()
