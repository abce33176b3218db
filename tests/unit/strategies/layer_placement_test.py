"""tfdist.LayerPlacementStrategy: bad input, plans for real models, the report.

Every deliberate error is a `tfdist.errors` class whose message names the
value received and the fix: checked at construction where the argument
alone says it (M < 1, a device that does not exist), at the model's first
step where the model is needed (unknown layer names, more stages than
layers with a map).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist import errors
from tfdist.placement import strategy as layer_placement

pytestmark = pytest.mark.model
keras = tf.keras
DEVICES = [f"/cpu:{i}" for i in range(4)]


def _model(widths=(16, 16, 3), name_prefix="d"):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,))]
        + [keras.layers.Dense(w, name=f"{name_prefix}{i}") for i, w in enumerate(widths)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _fit(strategy, widths=(16, 16, 3), batch_size=16):
    with strategy.scope():
        model = _model(widths)
    return _fit_model(model, batch_size)


def _fit_model(model, batch_size=16):
    rng = np.random.default_rng(0)
    model.fit(
        rng.normal(size=(2 * batch_size, 8)).astype("float32"),
        rng.normal(size=(2 * batch_size, model.output_shape[-1])).astype("float32"),
        batch_size=batch_size, epochs=1, verbose=0,
    )
    return model


class ConstructorValidationTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("zero", 0), ("negative", -2),
    )
    def test_num_microbatches_below_one_raises_config_error(self, value):
        with self.assertRaisesRegex(errors.ConfigError, rf"num_microbatches={value}.*integer >= 1"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], num_microbatches=value)

    def test_num_microbatches_not_int_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, r"num_microbatches=2.0"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], num_microbatches=2.0)

    def test_device_that_does_not_exist_raises_device_config_error(self):
        with self.assertRaisesRegex(errors.DeviceConfigError, r"CPU:9.*does not have.*simulate_cpu_devices"):
            tfdist.LayerPlacementStrategy(["/cpu:0", "/cpu:9"])

    def test_map_naming_a_missing_device_raises_device_config_error(self):
        with self.assertRaisesRegex(errors.DeviceConfigError, r"CPU:7"):
            tfdist.LayerPlacementStrategy(placement={"d0": "/cpu:7"})

    def test_unknown_placement_string_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, r"placement='round_robin'.*'balanced'"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], placement="round_robin")

    def test_placement_of_wrong_type_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, r"placement=3 of type int"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], placement=3)

    def test_empty_map_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, r"placement=\{\} names no layer"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], placement={})

    def test_unknown_balance_by_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, r"balance_by='bytes'.*'params', 'flops', 'measured'"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], balance_by="bytes")

    def test_rematerialize_not_bool_raises_type_error(self):
        with self.assertRaisesRegex(TypeError, r"rematerialize='yes'"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], rematerialize="yes")

    def test_data_parallel_not_dividing_the_devices_raises_config_error(self):
        with self.assertRaisesRegex(
                errors.ConfigError, r"data_parallel=2 .*received 3 devices.*Give 2 x"):
            tfdist.LayerPlacementStrategy(DEVICES[:3], data_parallel=2)

    def test_data_parallel_with_a_map_and_no_devices_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, r"data_parallel=2 with a placement map needs devices"):
            tfdist.LayerPlacementStrategy(placement={"d0": "/cpu:0"}, data_parallel=2)

    def test_data_parallel_below_one_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, r"data_parallel=0.*integer >= 1"):
            tfdist.LayerPlacementStrategy(DEVICES[:2], data_parallel=0)

    def test_data_parallel_cuts_the_devices_into_pipelines_in_order(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES, data_parallel=2)
        self.assertEqual(strategy.num_replicas_in_sync, 1)
        self.assertEqual(strategy.pipelines, (("/device:CPU:0", "/device:CPU:1"),
                                              ("/device:CPU:2", "/device:CPU:3")))

    def test_one_replica_whatever_the_devices(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES)
        self.assertEqual(strategy.num_replicas_in_sync, 1)
        self.assertEqual(strategy.devices, tuple(f"/device:CPU:{i}" for i in range(4)))


class PlanAtFirstStepTest(tf.test.TestCase, parameterized.TestCase):

    def test_map_with_unknown_layer_name_raises_at_first_step_naming_the_layers(self):
        strategy = tfdist.LayerPlacementStrategy(placement={"d0": "/cpu:1", "dense_9": "/cpu:2"})
        with self.assertRaisesRegex(errors.PlacementError, r"\['dense_9'\].*\['d0', 'd1', 'd2'\]"):
            _fit(strategy)

    def test_map_with_more_devices_than_layers_raises(self):
        strategy = tfdist.LayerPlacementStrategy(
            DEVICES, placement={"d0": "/cpu:0", "d1": "/cpu:1"}
        )
        with self.assertRaisesRegex(errors.PlacementError, r"asks for 4 stages but the model has only 2 layers"):
            _fit(strategy, widths=(16, 3))

    def test_map_without_devices_uses_the_devices_it_names(self):
        strategy = tfdist.LayerPlacementStrategy(placement={"d1": "/cpu:3"})
        _fit(strategy)
        plan = strategy.placement_plan()
        self.assertEqual(plan.devices, ("/device:CPU:3",))  # d0 follows d1's device.

    def test_balanced_with_more_devices_than_layers_leaves_the_rest_idle(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES)
        _fit(strategy, widths=(16, 3))
        plan = strategy.placement_plan()
        self.assertEqual(plan.num_stages, 2)
        self.assertEqual(plan.idle_devices, ("/device:CPU:2", "/device:CPU:3"))
        self.assertIn("idle devices (more devices than layers)", str(strategy.placement_report()))

    def test_balanced_by_params_puts_the_heavy_layer_alone(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2])
        _fit(strategy, widths=(256, 4, 4, 4))
        self.assertEqual(strategy.placement_plan().stages[0].layers, ("d0",))

    def test_callable_placement_gets_profiles_and_devices(self):
        received = {}

        def every_layer_last(layers, devices):
            received["names"] = [layer.name for layer in layers]
            received["params"] = [layer.params for layer in layers]
            return {layers[0].name: devices[-1]}

        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2], placement=every_layer_last)
        with self.assertRaisesRegex(errors.PlacementError, r"devices \['/device:CPU:0'\] get no layer"):
            _fit(strategy)
        self.assertEqual(received["names"], ["d0", "d1", "d2"])
        self.assertEqual(received["params"], [8 * 16 + 16, 16 * 16 + 16, 16 * 3 + 3])

    def test_placement_report_before_any_model_raises(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2])
        with self.assertRaisesRegex(errors.PlacementError, "no model has been placed.*strategy.place"):
            strategy.placement_report()

    def test_report_names_every_layer_and_its_device_with_measured_times(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:3], num_microbatches=2)
        _fit(strategy)
        report = strategy.placement_report()
        self.assertLen(report.stage_times_s, 3)
        self.assertTrue(all(t > 0 for t in report.stage_times_s))
        self.assertEqual(report.microbatch_rows, 8)  # Batches of 16, M = 2.
        for index, name in enumerate(("d0", "d1", "d2")):
            self.assertRegex(str(report), rf"{name} +/device:CPU:{index} +stage {index}")

    def test_unknown_batch_size_profiles_with_the_assumed_batch(self):
        # A generator's batches have no static size and no batch op to read.
        rng = np.random.default_rng(0)
        x = rng.normal(size=(16, 8)).astype("float32")
        y = rng.normal(size=(16, 3)).astype("float32")
        dataset = tf.data.Dataset.from_generator(
            lambda: iter([(x, y)]),
            output_signature=(tf.TensorSpec([None, 8]), tf.TensorSpec([None, 3])),
        )
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2], num_microbatches=2)
        with strategy.scope():
            model = _model()
        model.fit(dataset, epochs=1, verbose=0)
        self.assertEqual(
            strategy.placement_report().microbatch_rows,
            layer_placement.ASSUMED_BATCH_ROWS // 2,
        )

    def test_place_with_a_batch_profiles_that_batch_before_fit(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2], num_microbatches=2)
        with strategy.scope():
            model = _model()
        strategy.place(model, x=np.zeros((40, 8), "float32"))
        _fit_model(model)  # Placed already: fit keeps the plan.
        self.assertEqual(strategy.placement_report().microbatch_rows, 20)

    @parameterized.named_parameters(("flops", "flops"), ("measured", "measured"))
    def test_balance_by_flops_and_measured_plan_real_models(self, balance_by):
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2], balance_by=balance_by)
        _fit(strategy, widths=(64, 512, 4096, 4), batch_size=256)
        plan = strategy.placement_plan()
        self.assertEqual(plan.balance_by, balance_by)
        self.assertGreater(plan.stages[0].cost, 0)
        self.assertEqual(sum((stage.layers for stage in plan.stages), ()), ("d0", "d1", "d2", "d3"))
        if balance_by == "flops":
            # d2 (512 x 4096) outweighs the rest together: a stage of its
            # own (with the small last layer).
            self.assertEqual(plan.stages[0].layers, ("d0", "d1"))
        else:
            # Which small layer joins d2 follows their timings, which a
            # loaded machine reorders (CI saw d0 timed above d2+d3 on 16-row
            # batches): a benchmark's matter. d2 takes ~10x the others'
            # time together on 256 rows, so its stage bounds the pipeline,
            # and the costs are seconds.
            self.assertIn("d2", max(plan.stages, key=lambda stage: stage.cost).layers)
            self.assertLess(plan.bottleneck, 10.0)


class CustomLoopTest(tf.test.TestCase):

    def test_custom_loop_without_place_raises_naming_the_fix(self):
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2])
        with strategy.scope():
            model = _model()

        @tf.function
        def step(x):
            return strategy.run(lambda v: model(v), args=(x,))

        with self.assertRaisesRegex(errors.PlacementError, r"strategy.place\(model\)"):
            step(tf.zeros((4, 8)))

    def test_place_without_inputs_on_a_subclassed_model_raises(self):
        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.dense = keras.layers.Dense(2)

            def call(self, x):
                return self.dense(x)

        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2])
        with strategy.scope():
            model = Net()
            model(tf.zeros((1, 8)))
        with self.assertRaisesRegex(errors.PlacementError, r"declares no inputs.*x=next"):
            strategy.place(model)
        plan = strategy.place(model, x=np.zeros((4, 8), "float32"))
        self.assertEqual(plan.num_stages, 1)


class LookupLayerTest(tf.test.TestCase):
    def test_a_model_with_a_lookup_layer_is_placed_and_trained(self):
        # tf-keras lists a lookup table's handler (no variable, no shape)
        # among the layer's weights; placing such a model raised
        # AttributeError (keras-io's text example, end-to-end).
        strategy = tfdist.LayerPlacementStrategy(DEVICES[:2], num_microbatches=2)
        with strategy.scope():
            lookup = keras.layers.StringLookup()  # A vocabulary to adapt: a table handler.
        lookup.adapt(tf.constant([["a"], ["b"], ["c"]]))
        with strategy.scope():
            inputs = keras.Input((1,), dtype="string")
            x = keras.layers.Embedding(5, 4)(lookup(inputs))
            outputs = keras.layers.Dense(1)(keras.layers.Flatten()(x))
            model = keras.Model(inputs, outputs)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        history = model.fit(tf.constant([["a"], ["b"], ["c"], ["d"]]), np.ones((4, 1), "float32"),
                            batch_size=4, epochs=1, verbose=0)
        self.assertTrue(np.isfinite(history.history["loss"][0]))
        self.assertEqual(model.predict(tf.constant([["b"]]), verbose=0).shape, (1, 1))


if __name__ == "__main__":
    tfdist.testing.main()
