"""Keras 3 layers on split variables (`_internal/keras_sharded`), without a cluster.

A model's `Embedding` table (or `Dense` kernel) is swapped for a
`ShardedVariable` of three local shards of uneven rows holding the same
values, as TF's parameter-server strategy makes under a partitioner; a
training step must then equal the step on the whole variable, and an SGD
step must gather and scatter only rows of each shard (no whole read). The
same through `fit` on a cluster, with slots and checkpoints, is in
tests/integration/parameter_server_sharded_test.py.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable

import tfdist
from tfdist._internal import keras_sharded
from tests.front_end import KERAS_3

pytestmark = pytest.mark.skipif(
    not KERAS_3, reason="Keras 3's variables; tf-keras trains ShardedVariables itself"
)

VOCABULARY = 10
DIM = 4
#: Rows per shard: uneven, as TF's "div" sharding of 10 rows in 3 (the
#: only layout its ShardedVariable scatters into; TF's partitioners make it).
SHARD_ROWS = (4, 3, 3)


def _model(seed: int = 0):
    keras = tf.keras
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, DIM),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )


def _split(variable) -> list[tf.Variable]:
    """Makes Keras 3 `variable` wrap a ShardedVariable of its value; the shards."""
    value = variable.numpy()
    bounds = np.cumsum((0,) + SHARD_ROWS) * value.shape[0] // VOCABULARY
    shards = [
        tf.Variable(value[start:end], name=f"part_{index}")
        for index, (start, end) in enumerate(zip(bounds[:-1], bounds[1:]))
    ]
    variable._value = sharded_variable.ShardedVariable(shards, name="split")
    return shards


def _train_step(model, optimizer):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return step


class ActiveTest(tf.test.TestCase):

    def test_tf_is_as_it_was_after_the_last_block_is_left(self):
        gradient = tf.GradientTape.gradient
        with keras_sharded.active():
            self.assertTrue(keras_sharded.installed())
            self.assertIsNot(tf.GradientTape.gradient, gradient)
            with keras_sharded.active():  # Re-entered: still in place after the inner block.
                pass
            self.assertIsNot(tf.GradientTape.gradient, gradient)
        self.assertFalse(keras_sharded.installed())
        self.assertIs(tf.GradientTape.gradient, gradient)

    def test_blocks_of_two_threads_overlapping_leave_tf_as_it_was(self):
        gradient = tf.GradientTape.gradient
        entered, leave = threading.Event(), threading.Event()

        def hold():
            with keras_sharded.active():
                entered.set()
                leave.wait(timeout=30)

        holder = threading.Thread(target=hold)
        holder.start()
        self.assertTrue(entered.wait(timeout=30))
        with keras_sharded.active():
            pass
        self.assertIsNot(tf.GradientTape.gradient, gradient, "the other thread's block is open")
        leave.set()
        holder.join(timeout=30)
        self.assertIs(tf.GradientTape.gradient, gradient)


class SplitKerasVariableTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.enter_context(keras_sharded.active())
        rng = np.random.default_rng(0)
        self.x = tf.constant(rng.integers(0, VOCABULARY, size=(8, 3)), tf.int32)
        self.y = tf.constant(rng.normal(size=(8, 1)), tf.float32)

    def _compare(self, split_variable, optimizer_name):
        keras = tf.keras
        whole, split = _model(), _model()
        split.set_weights(whole.get_weights())
        shards = _split(split_variable(split))
        whole_step = _train_step(whole, keras.optimizers.get(optimizer_name))
        split_step = _train_step(split, keras.optimizers.get(optimizer_name))
        for _ in range(3):
            whole_loss = whole_step(self.x, self.y)
            split_loss = split_step(self.x, self.y)
            self.assertAllClose(split_loss, whole_loss, rtol=1e-6)
        for a, b in zip(split.get_weights(), whole.get_weights()):
            self.assertAllClose(a, b, rtol=1e-6, atol=1e-7)
        return split_step, shards

    # SGD: optimizers with slots create them colocated with the variable,
    # which the default strategy refuses for a ShardedVariable (the
    # parameter-server strategy splits them like it: integration test).
    def test_embedding_split_trains_as_whole(self):
        self._compare(lambda model: model.layers[0].embeddings, "sgd")

    def test_dense_kernel_split_trains_as_whole(self):
        self._compare(lambda model: model.layers[2].kernel, "sgd")  # Dense gradient.

    def test_sgd_step_touches_only_the_rows_of_each_shard(self):
        step, shards = self._compare(lambda model: model.layers[0].embeddings, "sgd")
        graph = step.get_concrete_function(self.x, self.y).graph
        handles = {id(shard.handle): shard for shard in shards}
        inside = {
            internal.ref(): handles[id(external)]
            for external, internal in graph.captures
            if id(external) in handles
        }
        self.assertLen(inside, len(SHARD_ROWS))
        uses = [
            op.type
            for op in graph.get_operations()
            for t in op.inputs
            if t.ref() in inside
        ]
        self.assertCountEqual(
            uses, ["ResourceGather"] * len(SHARD_ROWS) + ["ResourceScatterSub"] * len(SHARD_ROWS)
        )

    def test_other_sources_pass_through(self):
        variable = tf.Variable(3.0)
        with tf.GradientTape() as tape:
            loss = variable * variable
        self.assertAllClose(tape.gradient(loss, {"v": variable})["v"], 6.0)


if __name__ == "__main__":
    tfdist.testing.main()
