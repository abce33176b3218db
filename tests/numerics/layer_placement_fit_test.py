"""tfdist.LayerPlacementStrategy through model.fit equals one-device training.

Stages over 2 and 4 logical CPUs, M in {1, 2, 4} microbatches, SGD (with
momentum) and Adam, on a 5-layer MLP with uneven microbatches (batches of
30 rows: 8/8/7/7 for M = 4) and a last partial batch; loss and accuracy
histories match too. Two copies of a two-stage pipeline (pipeline x
data) the same way. Other models and steps: layer_placement_models_test.py.
Runs under Keras 3 and,
with TF_USE_LEGACY_KERAS=1, under tf-keras.
"""

from __future__ import annotations

import functools

import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist._internal import keras_layers
from tfdist.testing import numerics
from tests.numerics import placement_cases

pytestmark = [pytest.mark.model, pytest.mark.deferred_tf_keras]
keras = tf.keras

def _grid():
    # Every pipeline (2 and 4 stages, 1, 2 and 4 microbatches), each with
    # one optimizer, SGD and Adam alternating: the optimizer applies the
    # gradients the microbatches accumulated, whatever the schedule, so each
    # pair of the three axes is covered without their full product.
    pipelines = [(stages, m) for stages in (2, 4) for m in (1, 2, 4)]
    for index, (stages, m) in enumerate(pipelines):
        optimizer = ("sgd", "adam")[index % 2]
        yield {
            "testcase_name": f"{stages}stages_{m}microbatches_{optimizer}",
            "num_stages": stages,
            "num_microbatches": m,
            "optimizer": optimizer,
        }


def _kernel_devices(model):
    return {v.device for v in keras_layers.resource_variables(model) if v.trainable}


@functools.cache
def _reference(optimizer):
    """One device's run of `placement_cases.mlp_builder(optimizer)`, trained once per file."""
    x, y = placement_cases.data()
    return numerics.train_single_device(
        placement_cases.mlp_builder(optimizer), x, y,
        global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2)


class LayerPlacementFitEquivalenceTest(tf.test.TestCase, parameterized.TestCase):
    """Each case against one single-device run per optimizer (trained once)."""

    @parameterized.named_parameters(*_grid())
    def test_fit_matches_single_device(self, num_stages, num_microbatches, optimizer):
        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(
            placement_cases.DEVICES[:num_stages], num_microbatches=num_microbatches
        )
        comparison = numerics.assert_matches_single_device(
            placement_cases.mlp_builder(optimizer), strategy, x, y,
            global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL,
            check_inference=False, reference=_reference(optimizer),
        )
        for name in ("loss", "accuracy"):
            self.assertAllClose(
                comparison.distributed_history[name], comparison.single_device_history[name],
                rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL,
            )
        self.assertEqual(strategy.placement_plan().num_stages, num_stages)
        self.assertLen(_kernel_devices(comparison.distributed_model), num_stages)


#: Devices each `RecordedDense` layer's calls were traced on, by id of the layer.
_TRACED_ON: dict[int, set[str]] = {}


class RecordedDense(keras.layers.Dense):
    """A Dense layer that records the device of each of its traced calls."""

    def call(self, inputs):
        outputs = super().call(inputs)
        if not tf.executing_eagerly():
            _TRACED_ON.setdefault(id(self), set()).add(outputs.device)
        return outputs


def _recorded_mlp_builder(optimizer):
    def build():
        keras.utils.set_random_seed(1)
        return placement_cases.compiled(
            keras.Sequential(
                [keras.Input((8,))]
                + [RecordedDense(16, activation="relu") for _ in range(3)]
                + [RecordedDense(3)]
            ),
            optimizer,
        )

    return build


class PipelineTimesDataTest(tf.test.TestCase, parameterized.TestCase):
    """Two copies of a two-stage pipeline (data_parallel=2) on 4 CPUs, against one device."""

    # 1 microbatch with SGD, 2 with Adam (as `_grid` crosses them).
    @parameterized.named_parameters(("1microbatches_sgd", 1, "sgd"), ("2microbatches_adam", 2, "adam"))
    def test_fit_matches_single_device_and_runs_on_every_copy(self, num_microbatches, optimizer):
        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(
            placement_cases.DEVICES, num_microbatches=num_microbatches, data_parallel=2)
        comparison = numerics.assert_matches_single_device(
            _recorded_mlp_builder(optimizer), strategy, x, y,
            global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL,
            check_inference=True,
        )
        for name in ("loss", "accuracy"):
            self.assertAllClose(
                comparison.distributed_history[name], comparison.single_device_history[name],
                rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL,
            )
        first, second = strategy.pipelines
        for layer in comparison.distributed_model.layers:
            # The weights live on the first copy only; the layer ran on both.
            kernel_device = keras_layers.resource_variables(layer)[0].device
            position = first.index("/device:" + kernel_device.rsplit("/device:", 1)[-1])
            # ("": traces outside a step, Keras's build and the profile.)
            self.assertEqual(_TRACED_ON[id(layer)] - {""}, {first[position], second[position]},
                             msg=layer.name)
        self.assertIn("2 copies of the pipeline", str(strategy.placement_report()))


if __name__ == "__main__":
    tfdist.testing.main()
