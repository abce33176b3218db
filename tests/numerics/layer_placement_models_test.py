"""tfdist.LayerPlacementStrategy equals one device for every kind of model and step.

`evaluate` and `predict` with microbatches; a last batch with fewer rows
than M; functional (branches, a shared layer) and subclassed models;
sparse (embedding) gradients; a custom `train_step`. Runs under Keras 3 and,
with TF_USE_LEGACY_KERAS=1, under tf-keras.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import errors
from tfdist.testing import numerics
from tests.numerics import placement_cases

pytestmark = pytest.mark.model
keras = tf.keras

class InferenceAndUnevenBatchTest(tf.test.TestCase):

    def test_evaluate_and_predict_match_single_device_with_microbatches(self):
        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:3], num_microbatches=4)
        numerics.assert_matches_single_device(
            placement_cases.mlp_builder("adam"), strategy, x, y,
            global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=1,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL, check_inference=True,
        )

    def test_last_batch_with_fewer_rows_than_microbatches_is_exact(self):
        # 62 rows in batches of 30: the last batch has 2 rows for M = 4, so
        # two microbatches are empty and must contribute nothing.
        x, y = placement_cases.data(num_examples=62)
        strategy = tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:2], num_microbatches=4)
        comparison = numerics.assert_matches_single_device(
            placement_cases.mlp_builder("adam"), strategy, x, y,
            global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL, check_inference=True,
        )
        self.assertAllClose(
            comparison.distributed_history["loss"],
            comparison.single_device_history["loss"],
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL,
        )


class ModelKindsTest(tf.test.TestCase):

    def test_functional_model_with_branches_and_a_shared_layer_matches(self):
        def build():
            keras.utils.set_random_seed(2)
            inputs = keras.Input((8,), name="features")
            shared = keras.layers.Dense(8, activation="tanh", name="shared")
            left = keras.layers.Dense(16, activation="relu", name="left")(inputs)
            right = keras.layers.Dense(16, activation="relu", name="right")(shared(inputs))
            merged = keras.layers.Concatenate(name="merge")([left, right])
            again = shared(keras.layers.Dense(8, name="squeeze")(merged))
            outputs = keras.layers.Dense(3, name="logits")(again)
            return placement_cases.compiled(keras.Model(inputs, outputs), "adam")

        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:3], num_microbatches=2)
        numerics.assert_matches_single_device(
            build, strategy, x, y, global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL, check_inference=True,
        )
        plan = strategy.placement_plan()
        placed = [name for stage in plan.stages for name in stage.layers]
        self.assertEqual(placed.count("shared"), 1)  # Placed once, used twice.
        self.assertEqual(plan.num_stages, 3)

    def test_subclassed_model_matches(self):
        class Net(keras.Model):
            def __init__(self):
                super().__init__()
                self.first = keras.layers.Dense(16)
                self.second = keras.layers.Dense(16)
                self.head = keras.layers.Dense(3)

            def call(self, x):
                x = tf.nn.relu(self.first(x))  # An op between two layers.
                return self.head(tf.nn.relu(self.second(x)))

        def build():
            keras.utils.set_random_seed(3)
            model = Net()
            model(tf.zeros((1, 8)))
            return placement_cases.compiled(model, "sgd")

        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:3], num_microbatches=4)
        numerics.assert_matches_single_device(
            build, strategy, x, y, global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL, check_inference=True,
        )
        self.assertEqual(strategy.placement_plan().num_stages, 3)

    def test_embedding_gradients_stay_sparse_and_match(self):
        rng = np.random.default_rng(3)
        x = rng.integers(0, 50, size=(placement_cases.NUM_EXAMPLES, 5)).astype("int32")
        y = rng.integers(0, 2, placement_cases.NUM_EXAMPLES).astype("int32")

        def build():
            return tfdist.testing.small_embedding_classifier(keras.optimizers.SGD(0.5))

        numerics.assert_matches_single_device(
            build, tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:2], num_microbatches=4),
            x, y, global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL, check_inference=False,
        )


class CustomTrainStepTest(tf.test.TestCase):

    def _model_class(self, apply_twice):
        keras3 = hasattr(keras.optimizers.Optimizer, "stateless_apply")

        class CustomStep(keras.Sequential):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True)) if keras3 else self.compiled_loss(y, self(x, training=True))
                grads = tape.gradient(loss, self.trainable_variables)
                for _ in range(2 if apply_twice else 1):
                    self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
                return {"loss": loss}

        return CustomStep

    def _build(self, apply_twice=False):
        model_class = self._model_class(apply_twice)

        def build():
            keras.utils.set_random_seed(5)
            model = model_class(
                [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)]
            )
            model.compile(
                optimizer=placement_cases.optimizer("sgd"),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            return model

        return build

    def test_custom_train_step_gradients_are_scaled_per_microbatch(self):
        x, y = placement_cases.data()
        numerics.assert_matches_single_device(
            self._build(), tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:2], num_microbatches=4),
            x, y, global_batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=2,
            rtol=placement_cases.FLOAT32_RTOL, atol=placement_cases.FLOAT32_ATOL, check_inference=False,
        )

    def test_step_applying_twice_per_call_raises_placement_error(self):
        x, y = placement_cases.data()
        strategy = tfdist.LayerPlacementStrategy(placement_cases.DEVICES[:2], num_microbatches=2)
        with strategy.scope():
            model = self._build(apply_twice=True)()
        with self.assertRaisesRegex(errors.PlacementError, r"applied gradients 4 time\(s\) for num_microbatches=2"):
            model.fit(x, y, batch_size=placement_cases.GLOBAL_BATCH_SIZE, epochs=1, verbose=0)


if __name__ == "__main__":
    tfdist.testing.main()
