"""Every way a train_step applies gradients, and the common optimizers, equal one device.

Under tfdist.MirroredStrategy (4 replicas) and LayerPlacementStrategy (2
stages, 2 microbatches), `fit` of a model with a token and a position
embedding (sparse gradients, of batch-derived and of constant indices) and a
Dense layer trains one device's weights to float32 rounding:

- with Adam, each update path a Keras `train_step` may take: Keras's own
  step (`minimize` under tf-keras), `apply_gradients`, Keras 3's `apply`
  (keras-io's "customizing fit" guide), and a `LossScaleOptimizer`
  (tf-keras refuses one under strategies it does not list; tfdist's
  LayerPlacementStrategy makes it accept it); all of them under
  LayerPlacement, Keras's step and `apply` under Mirrored (whose other
  paths the conformance tier runs);
- with Keras's own step, SGD with momentum, AdamW, Adagrad and RMSprop
  (under MirroredStrategy; the rule is applied after the sum either way),
  and optimizers that clip (`clipnorm`, `global_clipnorm`, `clipvalue`) or
  scale the loss (a `LossScaleOptimizer`): one device clips, and checks for
  finiteness, the whole gradient, which Keras 3 does to each replica's part
  before its sum unless the strategy sums first
  (`tfdist/collectives/fused_step.py`).

Keras 3 and tf-keras.
"""

from __future__ import annotations

import functools

import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.numerics import position_embedding_fit_test as position
from tfdist.testing import numerics
from tests.front_end import KERAS_3

pytestmark = pytest.mark.model
keras = tf.keras

# Same examples and initial weights; only float32 summation order differs.
# Adam-like updates divide by the root of the squared gradient, magnifying
# rounding where a gradient nearly cancels (position_embedding_fit_test).
RTOL, ATOL = 1e-5, 1e-5

STRATEGIES = {
    "mirrored": lambda: tfdist.MirroredStrategy(position.DEVICES),
    "layer_placement": lambda: tfdist.LayerPlacementStrategy(
        position.DEVICES[:2], num_microbatches=2),
}
OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adamw": lambda: keras.optimizers.AdamW(0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    # Clipped: one device clips the whole batch's gradient (Keras 3 clips
    # each replica's part unless the strategy sums first). The bounds are
    # far below this model's gradient norms, so every step clips.
    "clipnorm": lambda: keras.optimizers.SGD(0.5, clipnorm=0.01),
    "global_clipnorm": lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.01),
    "clipvalue": lambda: keras.optimizers.SGD(0.5, clipvalue=0.001),
    "loss_scaled_adam": lambda: keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam(0.01)),
}
UPDATES = ("keras_step", "apply_gradients", "loss_scale") + (("apply",) if KERAS_3 else ())


class CustomStep(keras.Model):
    """A train_step that applies its gradients as `update` says."""

    update = "apply_gradients"

    def train_step(self, data):
        x, y = data
        scaled = self.update == "loss_scale"
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            if KERAS_3:
                loss = self.compute_loss(y=y, y_pred=y_pred)
                target = self.optimizer.scale_loss(loss) if scaled else loss
            else:
                loss = self.compiled_loss(y, y_pred)
                target = self.optimizer.get_scaled_loss(loss) if scaled else loss
        grads = tape.gradient(target, self.trainable_variables)
        if scaled and not KERAS_3:
            grads = self.optimizer.get_unscaled_gradients(grads)
        if self.update == "apply":
            self.optimizer.apply(grads, self.trainable_variables)
        else:
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def _builder(update: str, make_optimizer):
    def build():
        inputs = keras.Input(shape=(position.MAXLEN,), dtype="int32")
        x = position.TokenAndPositionEmbedding(position.MAXLEN, position.VOCAB, position.DIM)(inputs)
        x = keras.layers.GlobalAveragePooling1D()(x)
        outputs = keras.layers.Dense(position.CLASSES)(x)
        if update == "keras_step":
            model = keras.Model(inputs, outputs)
        else:
            model = CustomStep(inputs, outputs)
            model.update = update
        optimizer = make_optimizer()
        if update == "loss_scale":
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    return build


@functools.cache
def _reference(update, optimizer):
    """One device's run of `_builder(update, OPTIMIZERS[optimizer])`, trained once per file."""
    x, y = position._data()
    return numerics.train_single_device(
        _builder(update, OPTIMIZERS[optimizer]), x, y,
        global_batch_size=position.GLOBAL_BATCH_SIZE, epochs=1)


def _cases(values, strategies=tuple(STRATEGIES)):
    return [{"testcase_name": f"{s}_{v}", "strategy": s, "value": v}
            for s in strategies for v in values]


class OptimizerMatrixTest(tf.test.TestCase, parameterized.TestCase):

    def _assert_matches(self, update, optimizer, strategy):
        x, y = position._data()
        numerics.assert_matches_single_device(
            _builder(update, OPTIMIZERS[optimizer]), STRATEGIES[strategy](), x, y,
            global_batch_size=position.GLOBAL_BATCH_SIZE, epochs=1, rtol=RTOL, atol=ATOL,
            check_inference=False, reference=_reference(update, optimizer))

    # MirroredStrategy's own paths are the conformance tier's too (Keras's
    # step and an overridden one; a LossScaleOptimizer custom loop): here
    # its Keras 3 `apply`, and every path of the microbatched strategy.
    @parameterized.named_parameters(
        *_cases(UPDATES, strategies=("layer_placement",)),
        *_cases(("keras_step",) + (("apply",) if KERAS_3 else ()), strategies=("mirrored",)))
    def test_adam_through_each_update_path(self, strategy, value):
        self._assert_matches(value, "adam", strategy)

    # The update rule is applied after the strategy's sum, the same way for
    # both strategies (the update paths above differ per strategy).
    @parameterized.named_parameters(
        *_cases([name for name in OPTIMIZERS if name != "adam"], strategies=("mirrored",)))
    def test_optimizer_through_keras_step(self, strategy, value):
        self._assert_matches("keras_step", value, strategy)


if __name__ == "__main__":
    tf.test.main()
