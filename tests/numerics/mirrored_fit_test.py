"""tfdist.MirroredStrategy through model.fit equals one-device training.

Runs under Keras 3 and, with TF_USE_LEGACY_KERAS=1, under tf-keras
(`tf.keras` is whichever front end the environment selects).
"""

from __future__ import annotations

import functools
from unittest import mock


import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tfdist.collectives import cross_device_ops
from tfdist.testing import numerics

pytestmark = [pytest.mark.model, pytest.mark.deferred_tf_keras]
keras = tf.keras

# Same examples, same initial weights: the only difference is the order in
# which float32 partial sums are added (per replica, then across replicas),
# so weights agree to a few float32 ulps times the number of steps.
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-6
# fp16 gradient transfers round each replica's gradient to 11 significant
# bits (relative error ~5e-4); over 8 SGD steps at lr 0.1 on O(1) weights
# the drift stays well under 1e-3.
FP16_RTOL, FP16_ATOL = 1e-3, 1e-3
# bf16 keeps 8 significant bits (relative error ~4e-3 per transfer).
BF16_RTOL, BF16_ATOL = 1e-2, 1e-2

NUM_EXAMPLES = 128
GLOBAL_BATCH_SIZE = 32
DEVICES = [f"/cpu:{i}" for i in range(4)]


def _data(num_features=8, num_classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(NUM_EXAMPLES, num_features)).astype("float32")
    y = rng.integers(0, num_classes, NUM_EXAMPLES).astype("int32")
    return x, y


def _optimizer(name):
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=0.1)
    return keras.optimizers.Adam(learning_rate=0.01)


def _mlp_builder(optimizer_name):
    def build():
        return tfdist.testing.small_classifier(_optimizer(optimizer_name))

    return build


@functools.cache
def _reference(optimizer_name, epochs=2):
    """One device's run of `_mlp_builder(optimizer_name)` on `_data()`, trained once per file."""
    x, y = _data()
    return numerics.train_single_device(
        _mlp_builder(optimizer_name), x, y, global_batch_size=GLOBAL_BATCH_SIZE, epochs=epochs)


def _grid():
    # Every algorithm on 2 and 4 replicas, with SGD on one and Adam on the
    # other (crossed between algorithms): the optimizer reads the reduced
    # gradients, whichever algorithm summed them, so each pair of the three
    # axes is covered without their full product.
    for index, algorithm in enumerate(("ring", "tree", "reduce_to_one", "auto")):
        for n, optimizer in zip((2, 4), ("sgd", "adam") if index % 2 == 0 else ("adam", "sgd")):
            yield {
                "testcase_name": f"{algorithm}_{n}cpu_{optimizer}",
                "algorithm": algorithm,
                "num_replicas": n,
                "optimizer": optimizer,
            }


class MirroredFitEquivalenceTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(*_grid())
    def test_fit_matches_single_device(self, algorithm, num_replicas, optimizer):
        x, y = _data()
        strategy = tfdist.MirroredStrategy(
            DEVICES[:num_replicas], all_reduce=algorithm, bucket_bytes=256
        )
        comparison = numerics.assert_matches_single_device(
            _mlp_builder(optimizer), strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=False,
            reference=_reference(optimizer),
        )
        self.assertAllClose(
            comparison.distributed_history["loss"],
            comparison.single_device_history["loss"],
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
        )

    def test_one_collective_per_gradient_matches_single_device(self):
        # bucket_bytes=None: no buckets, every gradient reduced on its own.
        x, y = _data()
        strategy = tfdist.MirroredStrategy(DEVICES, all_reduce="tree", bucket_bytes=None)
        numerics.assert_matches_single_device(
            _mlp_builder("adam"), strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=False,
            reference=_reference("adam"),
        )

    def test_evaluate_and_predict_match_single_device(self):
        x, y = _data()
        strategy = tfdist.MirroredStrategy(DEVICES, all_reduce="ring")
        numerics.assert_matches_single_device(
            _mlp_builder("adam"), strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=1,
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=True,
        )

    @parameterized.named_parameters(
        {"testcase_name": "fp16", "compression": "fp16", "rtol": FP16_RTOL, "atol": FP16_ATOL},
        {"testcase_name": "bf16", "compression": "bf16", "rtol": BF16_RTOL, "atol": BF16_ATOL},
    )
    def test_compressed_fit_matches_within_stated_tolerance(
        self, compression, rtol, atol
    ):
        x, y = _data()
        strategy = tfdist.MirroredStrategy(
            DEVICES, all_reduce="ring", compression=compression
        )
        comparison = numerics.assert_matches_single_device(
            _mlp_builder("sgd"), strategy, x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=rtol, atol=atol, check_inference=False,
            reference=_reference("sgd"),
        )
        # The wire really is 16-bit: results are not bit-identical.
        self.assertGreater(comparison.max_weight_difference[1], 0.0)


class SparseGradientTest(tf.test.TestCase):

    def test_embedding_model_matches_single_device_without_densifying(self):
        rng = np.random.default_rng(3)
        x = rng.integers(0, 50, size=(NUM_EXAMPLES, 5)).astype("int32")
        y = rng.integers(0, 2, NUM_EXAMPLES).astype("int32")

        def build():
            return tfdist.testing.small_embedding_classifier(keras.optimizers.SGD(0.5))

        # The embedding's gradient must reach the all-reduce as IndexedSlices
        # (rows only) and be gathered, not densified into a [50, 4] tensor.
        gathered_row_shapes = []
        original_sparse = cross_device_ops.AllReduce._all_gather_sparse

        def gather_sparse(op, reduce_op, slices, devices):
            gathered_row_shapes.append(tuple(slices[0].values.shape[1:]))
            return original_sparse(op, reduce_op, slices, devices)

        with mock.patch.object(cross_device_ops.AllReduce, "_all_gather_sparse", gather_sparse):
            numerics.assert_matches_single_device(
                build, tfdist.MirroredStrategy(DEVICES, all_reduce="ring"), x, y,
                global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
                rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL, check_inference=False,
            )
        # Rows of 4 in every trace (tf-keras traces its step again for the
        # epoch's short last batch; Keras 3 once).
        self.assertNotEmpty(gathered_row_shapes)
        self.assertEqual(set(gathered_row_shapes), {(4,)})


class BatchNormalizationTest(tf.test.TestCase):

    def _builder(self, synchronized):
        def build():
            keras.utils.set_random_seed(4)
            model = keras.Sequential(
                [
                    keras.Input((8,)),
                    keras.layers.Dense(16),
                    keras.layers.BatchNormalization(synchronized=synchronized),
                    keras.layers.Dense(3),
                ]
            )
            model.compile(
                optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
            return model

        return build

    def test_synchronized_batch_norm_matches_global_batch_statistics(self):
        x, y = _data()
        numerics.assert_matches_single_device(
            self._builder(True), tfdist.MirroredStrategy(DEVICES), x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
            rtol=FLOAT32_RTOL, atol=1e-5, check_inference=True,
        )

    def test_unsynchronized_batch_norm_diverges_from_single_device(self):
        x, y = _data()
        with self.assertRaisesRegex(AssertionError, "differ beyond"):
            numerics.assert_matches_single_device(
                self._builder(False), tfdist.MirroredStrategy(DEVICES), x, y,
                global_batch_size=GLOBAL_BATCH_SIZE, epochs=2,
                rtol=FLOAT32_RTOL, atol=1e-5, check_inference=False,
            )


class CheckpointTest(tf.test.TestCase):

    def test_saved_weights_load_into_a_single_device_model(self):
        x, y = _data()
        build = _mlp_builder("adam")
        strategy = tfdist.MirroredStrategy(DEVICES)
        with strategy.scope():
            distributed = build()
        distributed.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=1, verbose=0)
        path = self.create_tempfile("model.weights.h5").full_path
        distributed.save_weights(path)
        single = build()
        single.load_weights(path)
        numerics.assert_weights_close(single, distributed, rtol=0, atol=0)
        self.assertAllClose(
            single.predict(x, verbose=0), distributed.predict(x, verbose=0),
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
        )

    def test_backup_and_restore_resumes_to_the_uninterrupted_result(self):
        x, y = _data()
        build = _mlp_builder("adam")
        strategy = tfdist.MirroredStrategy(DEVICES)
        with strategy.scope():
            uninterrupted = build()
        initial = uninterrupted.get_weights()
        uninterrupted.fit(
            x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=3, shuffle=False, verbose=0
        )

        class _Interrupt(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == 2:
                    raise RuntimeError("simulated preemption")

        backup_dir = self.create_tempdir().full_path
        with strategy.scope():
            interrupted = build()
        interrupted.set_weights(initial)
        with self.assertRaisesRegex(RuntimeError, "simulated preemption"):
            interrupted.fit(
                x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=3, shuffle=False,
                verbose=0,
                callbacks=[keras.callbacks.BackupAndRestore(backup_dir), _Interrupt()],
            )
        with strategy.scope():
            resumed = build()
        history = resumed.fit(
            x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=3, shuffle=False, verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(backup_dir)],
        )
        self.assertLen(history.history["loss"], 1)  # Only epoch 3 ran again.
        numerics.assert_weights_close(
            resumed, uninterrupted, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL
        )


class UnevenBatchTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(("sgd", "sgd"), ("adam", "adam"))
    def test_batch_the_replicas_do_not_divide_matches_single_device(self, optimizer):
        # GLOBAL_BATCH_SIZE (32) rows on 3 replicas: slices of 11, 11 and 10 every step.
        x, y = _data()
        comparison = numerics.assert_matches_single_device(
            _mlp_builder(optimizer), tfdist.MirroredStrategy(DEVICES[:3]), x, y,
            global_batch_size=GLOBAL_BATCH_SIZE, epochs=2, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
            reference=_reference(optimizer),
        )
        self.assertAllClose(
            comparison.distributed_history["loss"], comparison.single_device_history["loss"],
            rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
        )


if __name__ == "__main__":
    tfdist.testing.main()
