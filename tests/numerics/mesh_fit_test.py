"""tfdist.MeshStrategy through model.fit equals one-device training.

Meshes (1, 4), (2, 2) and (4, 1) of 4 logical CPUs ("batch" x "model"),
SGD and Adam, on a column-then-row Dense pair (Megatron's MLP: each mesh,
both optimizers on 2 x 2; under tf-keras on 4 x 1 only), on a
transformer block (attention by heads, its MLP column-then-row, layer norms
whole, the token table whole or split by rows) and on an embedding bag
trained by Adam (its row updates sparse); 70 examples in batches of 16,
so the last batch (6) is one the 4-way batch axis does not divide.
Weights, loss history, `evaluate` and `predict` agree to float32 rounding;
weights saved under a mesh load on one device and back; a device holds a
quarter of a 4-way split model (read from the variables' slices).

Under Keras 3 the mesh and layouts are Keras's own
(`keras.distribution.DeviceMesh`, `LayoutMap`); under tf-keras, which has
none, tfdist's of the same signatures (`tfdist.mesh`); TF's DTensor cannot
lay out tf-keras's layer norm, which the strategy refuses (tested).

With the batch split, TF 2.21's DTensor ran a read of an optimizer slot
before its write (every weight one step behind) until the strategy
forwarded writes to reads: the transformer on 4 x 1, the custom loop on
4 x 1 and tf-keras on a split batch are the tests that caught it.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.front_end import KERAS_3
from tfdist import errors
from tfdist._internal import keras_layers
from tfdist.testing import numerics

pytestmark = pytest.mark.model
keras = tf.keras

# Same examples and initial weights; DTensor sums the partial products of a
# split matmul, and the batch's per-device gradients, in another order than
# one device: a few float32 ulps per step on O(1) values.
FLOAT32_RTOL, FLOAT32_ATOL = 1e-5, 1e-6
NUM_EXAMPLES, GLOBAL_BATCH_SIZE = 70, 16
MESHES = ((1, 4), (2, 2), (4, 1))

MLP_LAYOUT = {
    ".*up/kernel": (None, "model"),   # column-parallel
    ".*up/bias": ("model",),
    ".*down/kernel": ("model", None),  # row-parallel: one all-reduce after it
}
# The token table stays whole here; split by rows in its own test.
TRANSFORMER_LAYOUT = {
    ".*attention/(query|key|value)/kernel": (None, "model", None),  # by heads
    ".*attention/(query|key|value)/bias": ("model", None),
    ".*attention/attention_output/kernel": ("model", None, None),
    ".*mlp_up/kernel": (None, "model"),
    ".*mlp_up/bias": ("model",),
    ".*mlp_down/kernel": ("model", None),
}


def _optimizer(name):
    return keras.optimizers.SGD(0.1) if name == "sgd" else keras.optimizers.Adam(0.01)


def _mlp(optimizer):
    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", name="up"),
            keras.layers.Dense(4, name="down"),
            keras.layers.Dense(3, name="head"),
        ])
        model.compile(
            optimizer=_optimizer(optimizer),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        return model

    return build


def _transformer():
    keras.utils.set_random_seed(2)
    tokens = keras.Input((6,), dtype="int32")
    x = keras.layers.Embedding(32, 16, name="token")(tokens)
    attended = keras.layers.MultiHeadAttention(4, 4, name="attention")(x, x)
    x = keras.layers.LayerNormalization(name="norm_1")(x + attended)
    hidden = keras.layers.Dense(32, activation="relu", name="mlp_up")(x)
    x = keras.layers.LayerNormalization(name="norm_2")(x + keras.layers.Dense(16, name="mlp_down")(hidden))
    outputs = keras.layers.Dense(3, name="head")(keras.layers.GlobalAveragePooling1D()(x))
    model = keras.Model(tokens, outputs)
    # SGD with momentum, not Adam: the key projection's bias has a zero
    # gradient in exact arithmetic (softmax ignores a shift shared by every
    # key), and Adam turns its rounding noise into steps of up to the
    # learning rate whose sign the order of additions decides. Adam is
    # covered on the Dense pair.
    model.compile(
        optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def _image_batch_norm():
    """A BatchNormalization over 2x2 images: tf-keras's fused kernel (rank 4)."""
    model = keras.Sequential([
        keras.Input((2, 2, 2)),
        keras.layers.BatchNormalization(name="norm"),
        keras.layers.Flatten(),
        keras.layers.Dense(3, name="head"),
    ])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _dropout():
    model = keras.Sequential([
        keras.Input((8,)), keras.layers.Dropout(0.5), keras.layers.Dense(3, name="head")])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(tokens=False):
    rng = np.random.default_rng(0)
    if tokens:
        x = rng.integers(0, 32, (NUM_EXAMPLES, 6)).astype("int32")
    else:
        x = rng.normal(size=(NUM_EXAMPLES, 8)).astype("float32")
    return x, rng.integers(0, 3, NUM_EXAMPLES).astype("int32")


class _SharpnessAware(keras.Model):
    """SAM (keras-io's "Sharpness-Aware Minimization" train_step): each weight is
    moved, differentiated through, and moved back within one step."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        weights = self.trainable_variables
        gradients = tape.gradient(loss, weights)
        scale = 0.05 / (tf.linalg.global_norm(gradients) + 1e-12)
        moves = [g * scale for g in gradients]
        for weight, move in zip(weights, moves):
            weight.assign_add(move)
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        sam_gradients = tape.gradient(loss, weights)  # Reads after writes: forwarded.
        for weight, move in zip(weights, moves):
            weight.assign_sub(move)
        self.optimizer.apply_gradients(zip(sam_gradients, weights))
        return {"loss": loss}


def _sam():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu", name="up")(inputs)
    outputs = keras.layers.Dense(3, name="head")(keras.layers.Dense(4, name="down")(hidden))
    model = _SharpnessAware(inputs, outputs, name="sam")
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _embedding_bag(optimizer="adam"):
    # Adam on row gradients: Keras squares each looked-up row's gradient
    # before the repeats of a token are summed, so a gradient made dense
    # first would train another model (0.05 away after 2 epochs). Plain SGD
    # updates the table with a row scatter, which TF's DTensor cannot run:
    # the mesh adds the rows as one dense update.
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((6,), dtype="int32"),
        keras.layers.Embedding(32, 8, name="token"),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(3, name="head"),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(0.01) if optimizer == "adam" else keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


@functools.cache
def _reference(optimizer=None):
    """One device's run of `_mlp(optimizer)` (`None`: of `_transformer`), trained once per file."""
    x, y = _data(tokens=optimizer is None)
    build = _transformer if optimizer is None else _mlp(optimizer)
    return numerics.train_single_device(
        build, x, y, global_batch_size=GLOBAL_BATCH_SIZE, epochs=2)


def _strategy(shape, layout):
    # Keras 3's own mesh and layout map; tfdist's of the same signatures for tf-keras.
    distribution = keras.distribution if KERAS_3 else tfdist.mesh
    mesh = distribution.DeviceMesh(shape, ("batch", "model"), [f"cpu:{i}" for i in range(4)])
    layout_map = distribution.LayoutMap(mesh)
    for pattern, axes in layout.items():
        layout_map[pattern] = axes
    return tfdist.MeshStrategy(mesh, layout_map=layout_map, batch_dim_name="batch")



def _grid():
    # Every mesh, each optimizer on the hybrid one; Adam on 1 x 4 is the
    # custom loop's, SGD's momentum on 4 x 1 the transformer's (where TF's
    # DTensor read it before its write). Under tf-keras the grid runs on 4 x
    # 1 only, where tf-keras on a split batch caught that read: the layouts
    # are the mesh's whatever the front end, and tf-keras's own paths (its
    # lookups, layer norms, optimizer) are the table and transformer tests'.
    if KERAS_3:
        cases = (((1, 4), "sgd"), ((2, 2), "sgd"), ((2, 2), "adam"), ((4, 1), "adam"))
    else:
        cases = (((4, 1), "sgd"), ((4, 1), "adam"))
    for shape, optimizer in cases:
        yield {
            "testcase_name": f"{shape[0]}x{shape[1]}_{optimizer}",
            "shape": shape,
            "optimizer": optimizer,
        }


class MeshFitTest(parameterized.TestCase):

    @parameterized.named_parameters(*_grid())
    @pytest.mark.deferred_tf_keras
    def test_column_then_row_dense_fit_matches_one_device(self, shape, optimizer):
        x, y = _data()
        comparison = numerics.assert_matches_single_device(
            _mlp(optimizer), _strategy(shape, MLP_LAYOUT), x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=optimizer == "adam",
            reference=_reference(optimizer),
        )
        np.testing.assert_allclose(
            comparison.distributed_history["loss"], comparison.single_device_history["loss"],
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
        )

    @parameterized.named_parameters(("tensor_parallel", (1, 4)), ("batch_split", (4, 1)))
    @pytest.mark.deferred_tf_keras
    def test_transformer_block_split_by_heads_matches_one_device(self, shape):
        # On 4 x 1 attention's 3-D kernels made TF's DTensor read SGD's
        # momentum before writing it, until writes were forwarded to reads.
        x, y = _data(tokens=True)
        strategy = _strategy(shape, TRANSFORMER_LAYOUT)
        comparison = numerics.assert_matches_single_device(
            _transformer, strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=True,
            reference=_reference(),
        )
        del comparison
        report = strategy.layout_report()
        self.assertRegex(report, r"attention/query/kernel \| \(16, 4, 4\) \| \(None, 'model', None\)")
        self.assertRegex(report, r"token/embeddings \| \(32, 16\) \| \(None, None\)")
        self.assertRegex(report, r"norm_1/gamma \| \(16,\) \| \(None,\)")

    def test_automatic_layouts_split_the_transformer_as_megatron_and_match_one_device(self):
        x, y = _data(tokens=True)
        strategy = tfdist.MeshStrategy({"batch": 1, "model": 4}, layout_map=None)
        numerics.assert_matches_single_device(
            _transformer, strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=False,
            reference=_reference(),
        )
        report = strategy.layout_report()
        for variable, axes, why in (
            ("attention/value/kernel", r"\(None, 'model', None\)", "split by heads"),
            ("mlp_up/kernel", r"\(None, 'model'\)", "column-parallel"),
            ("mlp_down/kernel", r"\('model', None\)", "row-parallel"),
            ("token/embeddings", r"\('model', None\)", "embedding: split by rows"),
            ("head/kernel", r"\(None, None\)", "3 outputs do not divide"),
        ):
            with self.subTest(variable=variable):
                self.assertRegex(report, rf"{variable} \| [^|]+ \| {axes} \| \d+ \| [^|\n]*{why}")


    def test_transformer_with_its_table_split_by_rows_on_a_hybrid_mesh_matches_one_device(self):
        x, y = _data(tokens=True)
        strategy = _strategy((2, 2), {**TRANSFORMER_LAYOUT, ".*token/embeddings": ("model", None)})
        numerics.assert_matches_single_device(
            _transformer, strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=True,
            reference=_reference(),
        )
        self.assertRegex(strategy.layout_report(), r"token/embeddings \| \(32, 16\) \| \('model', None\)")

    @parameterized.named_parameters(("adam", "adam"), ("plain_sgd", "sgd"))
    @pytest.mark.deferred_tf_keras
    def test_a_table_with_the_batch_split_matches_one_device(self, optimizer):
        x, y = _data(tokens=True)
        strategy = _strategy((2, 2), {".*token/embeddings": ("model", None)})
        numerics.assert_matches_single_device(
            functools.partial(_embedding_bag, optimizer), strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=True,
        )
        # tf-keras looks a table up with the variable's sparse_read (DTensor
        # cannot run its ResourceGather on a table split by rows; the mesh's
        # variables gather from the value read instead).
        self.assertRegex(strategy.layout_report(), r"token/embeddings \| \(32, 8\) \| \('model', None\)")


    @parameterized.named_parameters(("adam", "adam"), ("plain_sgd", "sgd"))
    @pytest.mark.deferred_tf_keras
    def test_a_table_split_by_columns_matches_one_device(self, optimizer):
        x, y = _data(tokens=True)
        strategy = _strategy((1, 4), {".*token/embeddings": (None, "model")})
        numerics.assert_matches_single_device(
            functools.partial(_embedding_bag, optimizer), strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=True,
        )

    @pytest.mark.skipif(KERAS_3, reason=(
        "Keras 3's step does not compile with this table split by columns: refused "
        "(test_keras_3_transformer_with_a_table_split_by_columns_raises_layout_error_naming_it)"))
    def test_tf_keras_transformer_with_its_table_split_by_columns_matches_one_device(self):
        x, y = _data(tokens=True)
        strategy = _strategy((2, 2), {**TRANSFORMER_LAYOUT, ".*token/embeddings": (None, "model")})
        numerics.assert_matches_single_device(
            _transformer, strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=True,
            reference=_reference(),
        )


class MeshCustomTrainStepTest(parameterized.TestCase):

    @parameterized.named_parameters(("batch_split", (4, 1)), ("hybrid", (2, 2)))
    @pytest.mark.deferred_tf_keras
    def test_sharpness_aware_train_step_matches_one_device(self, shape):
        # It reads each weight after writing it in the same step, under a
        # GradientTape: before forwarded reads counted as reads to the tape,
        # fit failed here with "No gradients provided for any variable".
        x, y = _data()
        numerics.assert_matches_single_device(
            _sam, _strategy(shape, MLP_LAYOUT), x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=False,
        )


class MeshCustomLoopTest(parameterized.TestCase):
    """A custom training loop: the distributed dataset iterated eagerly, `strategy.run` in a `tf.function`.

    The loss as TF's custom training tutorial takes it (`reduction="none"`,
    then `tf.nn.compute_average_loss`): tf-keras refuses a loss's default
    reduction inside any strategy's `run`, TF's own strategies included.

    On a tensor-parallel mesh (1 x 4) and with the batch split (4 x 1: 0.025
    away from one device after an epoch before the strategy forwarded
    writes to reads).
    """

    def _train(self, model, batches, run):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        @tf.function
        def step(x, y):
            def replica_step(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(
                        loss_fn(y, model(x, training=True)), global_batch_size=GLOBAL_BATCH_SIZE)
                gradients = tape.gradient(loss, model.trainable_variables)
                model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
                return loss

            return run(replica_step, x, y)

        for x, y in batches:
            step(x, y)

    @parameterized.named_parameters(("tensor_parallel", (1, 4)), ("batch_split", (4, 1)))
    @pytest.mark.deferred_tf_keras
    def test_custom_loop_matches_one_device(self, shape):
        x, y = _data()
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
        reference = _mlp("adam")()
        initial = reference.get_weights()
        self._train(reference, dataset, lambda fn, *args: fn(*args))
        strategy = _strategy(shape, MLP_LAYOUT)
        with strategy.scope():
            model = _mlp("adam")()
        model.set_weights(initial)
        self._train(
            model, strategy.experimental_distribute_dataset(dataset),
            lambda fn, *args: strategy.run(fn, args=args),
        )
        numerics.assert_weights_close(model, reference, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL)


class MeshStateTest(tf.test.TestCase):

    def _trained(self, strategy):
        x, y = _data()
        with strategy.scope():
            model = _mlp("adam")()
        model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, shuffle=False, verbose=0)
        return model, x

    def test_weights_saved_under_the_mesh_load_on_one_device_and_back(self):
        model, x = self._trained(_strategy((2, 2), MLP_LAYOUT))
        path = os.path.join(self.get_temp_dir(), "mesh.weights.h5")
        model.save_weights(path)
        single = _mlp("adam")()
        single.load_weights(path)
        numerics.assert_weights_close(single, model, rtol=0, atol=0)

        back_path = os.path.join(self.get_temp_dir(), "single.weights.h5")
        single.save_weights(back_path)
        strategy = _strategy((1, 4), MLP_LAYOUT)
        with strategy.scope():
            reloaded = _mlp("adam")()
        reloaded.load_weights(back_path)
        numerics.assert_weights_close(reloaded, single, rtol=0, atol=0)
        np.testing.assert_allclose(
            reloaded.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0),
            single.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0),
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
        )

    def test_a_device_holds_a_quarter_of_a_four_way_split_model_and_its_slots(self):
        from tensorflow.experimental import dtensor  # noqa: PLC0415 - TF's public DTensor.

        layout = {".*up/kernel": (None, "model"), ".*up/bias": ("model",),
                  ".*down/kernel": ("model", None), ".*head/kernel": ("model", None)}
        model, _ = self._trained(_strategy((1, 4), layout))
        variables = [keras_layers.storage_variable(v) for v in model.weights + model.optimizer.variables]
        split = [v for v in variables if "model" in dtensor.fetch_layout(v).sharding_specs]
        self.assertLen(split, 12)  # 4 variables and Adam's 2 slots each.
        for variable in split:
            with self.subTest(variable=variable.name):
                slices = dtensor.unpack(variable.read_value())
                self.assertLen(slices, 4)
                self.assertEqual(slices[0].numpy().size * 4, np.prod(variable.shape))
                self.assertEqual(len({s.device for s in slices}), 4)


class MeshErrorsTest(parameterized.TestCase):

    def test_bad_arguments_raise_layout_error_before_any_model(self):
        for kwargs, pattern in (
            ({"mesh": {"batch": 3, "model": 2}, "layout_map": {}}, "6 positions"),
            ({"mesh": {"batch": 2, "model": 2}, "layout_map": {}, "batch_dim_name": "data"},
             r"batch_dim_name='data' is not an axis.*\['batch', 'model'\]"),
            ({"mesh": {"batch": 1, "model": 4}, "layout_map": {"k": ("tensor",)}}, "axis 'tensor'"),
        ):
            with self.subTest(**{k: str(v) for k, v in kwargs.items()}):
                with self.assertRaisesRegex(errors.LayoutError, pattern):
                    tfdist.MeshStrategy(**kwargs)

    def test_non_positive_timeout_raises_config_error_naming_it(self):
        with self.assertRaisesRegex(errors.ConfigError, r"timeout_s.*-1"):
            tfdist.MeshStrategy({"batch": 2, "model": 2}, layout_map={}, timeout_s=-1)

    @pytest.mark.skipif(not KERAS_3, reason=(
        "tf-keras's step compiles with this table split by columns and trains "
        "(test_tf_keras_transformer_with_its_table_split_by_columns_matches_one_device)"))
    def test_keras_3_transformer_with_a_table_split_by_columns_raises_layout_error_naming_it(self):
        # TF's DTensor cannot compile this step ("EmitAllScatter was passed a
        # desired_layout", naming no variable).
        x, y = _data(tokens=True)
        strategy = _strategy((2, 2), {**TRANSFORMER_LAYOUT, ".*token/embeddings": (None, "model")})
        with strategy.scope():
            model = _transformer()
        with self.assertRaisesRegex(
            errors.LayoutError,
            r"table split along a dimension other than its rows \([^)]*token/embeddings \(None, 'model'\)"
        ):
            model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0)

    @pytest.mark.skipif(KERAS_3, reason="tf-keras's own refusals")
    def test_tf_keras_batch_norm_and_dropout_raise_layout_error_naming_the_fix(self):
        # Obscure otherwise: DTensor fails on FusedBatchNormV3 or on a
        # stateful random op with an UnknownError naming no layer.
        x, y = _data()
        for build, inputs, pattern in (
            (_image_batch_norm, x.reshape(-1, 2, 2, 2), "'FusedBatchNormV3'.*BatchNormalization"),
            (_dropout, x, r"stateful random ops.*Dropout.*dropout rate 0"),
        ):
            with self.subTest(model=build.__name__):
                strategy = _strategy((1, 4), {})
                with strategy.scope():
                    model = build()
                with self.assertRaisesRegex(errors.LayoutError, pattern):
                    model.fit(inputs, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0)

    def test_a_split_convolution_kernel_raises_layout_error_naming_it(self):
        # TF's DTensor convolves only whole filters ("Filter for convolution
        # must have fully replicated layout", naming no variable).
        x = np.random.default_rng(0).normal(size=(16, 6, 6, 1)).astype("float32")
        y = np.zeros(16, "int32")
        strategy = _strategy((2, 2), {".*conv/kernel": (None, None, None, "model")})
        with strategy.scope():
            model = keras.Sequential([
                keras.Input((6, 6, 1)), keras.layers.Conv2D(4, 3, name="conv"),
                keras.layers.Flatten(), keras.layers.Dense(3),
            ])
            model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        with self.assertRaisesRegex(
            errors.LayoutError, r"whole filter.*conv/kernel \(None, None, None, 'model'\)"
        ):
            model.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0)

    def test_split_dimension_the_axis_does_not_divide_fails_at_build_naming_the_variable(self):
        strategy = tfdist.MeshStrategy({"batch": 1, "model": 4}, layout_map={".*head/kernel": (None, "model")})
        with self.assertRaisesRegex(
            errors.LayoutError, r"'(.*/)?head/kernel' of shape \(4, 3\) cannot split dimension 1 \(3\)"
        ):
            with strategy.scope():
                _mlp("sgd")()


if __name__ == "__main__":
    tfdist.testing.main()
