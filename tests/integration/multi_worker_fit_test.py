"""tfdist.MultiWorkerMirroredStrategy on a 2-process cluster on 127.0.0.1.

Each worker builds the strategy from its TF_CONFIG and trains through
`model.fit`; the result must equal one process training with the same
global batch. Runs under Keras 3 and (TF_USE_LEGACY_KERAS=1) tf-keras.
The workers share this host's /dev/shm, so the default transport ("auto")
takes shared memory; `GrpcMultiWorkerFitTest` and the fp16 case take TF's
collectives over gRPC.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.numerics import position_embedding_fit_test as position
from tfdist import errors
from tfdist.collectives import host_memory
from tfdist.testing import run_local_cluster

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

# Same examples and initial weights; only float32 summation order differs.
FLOAT32_RTOL = 1e-5
FLOAT32_ATOL = 1e-6
GLOBAL_BATCH_SIZE = 32
# 118 = 3 * 32 + 22: a short last step, split 11 + 11 over the workers.
NUM_EXAMPLES = 118
CLUSTER_TIMEOUT_S = 150


def train(use_strategy: bool, strategy_kwargs: dict | None = None) -> dict[str, object]:
    """Fits the test model; with `use_strategy`, on the TF_CONFIG cluster."""
    keras = tf.keras
    strategy = (
        tfdist.MultiWorkerMirroredStrategy(timeout_s=60, **(strategy_kwargs or {}))
        if use_strategy
        else tf.distribute.get_strategy()
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, 8)).astype("float32")
    y = rng.integers(0, 3, NUM_EXAMPLES).astype("int32")
    with strategy.scope():
        model = tfdist.testing.small_classifier(keras.optimizers.Adam(0.01))
    history = model.fit(
        x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0
    )
    host_group = strategy.cross_device_ops.host_group if use_strategy else None
    return {
        "transport": strategy.transport if use_strategy else None,
        "host_calls": host_group.calls if host_group is not None else 0,
        "weights": model.get_weights(),
        "loss": history.history["loss"],
        "evaluate": model.evaluate(x, y, batch_size=GLOBAL_BATCH_SIZE, verbose=0),
        "predict": model.predict(x, batch_size=GLOBAL_BATCH_SIZE, verbose=0),
    }



class MultiWorkerFitTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workers = run_local_cluster(
            train, num_workers=2, args=(True,), timeout_s=CLUSTER_TIMEOUT_S
        )
        cls.reference = train(False)

    def test_the_default_transport_of_workers_on_one_host_is_shared_memory(self):
        for worker in self.workers:
            self.assertEqual(worker["transport"], "host_memory")
            # Every step's buckets went through the group: 2 epochs of 4 steps.
            self.assertGreaterEqual(worker["host_calls"], 2 * 4)
        self.assertEqual(self.workers[0]["host_calls"], self.workers[1]["host_calls"])

    def test_workers_end_with_identical_weights(self):
        first, second = self.workers
        for a, b in zip(first["weights"], second["weights"]):
            self.assertAllEqual(a, b)

    def test_weights_match_single_process_with_same_global_batch(self):
        for worker in self.workers:
            for a, b in zip(worker["weights"], self.reference["weights"]):
                self.assertAllClose(a, b, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL)

    def test_fit_and_evaluate_metrics_match_single_process(self):
        for worker in self.workers:
            self.assertAllClose(
                worker["loss"], self.reference["loss"],
                rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
            )
            self.assertAllClose(
                worker["evaluate"], self.reference["evaluate"],
                rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
            )

    def test_predict_returns_every_row_once_in_order(self):
        for worker in self.workers:
            self.assertEqual(worker["predict"].shape, (NUM_EXAMPLES, 3))
            self.assertAllClose(
                worker["predict"], self.reference["predict"],
                rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL,
            )


class CompressedMultiWorkerFitTest(tf.test.TestCase, parameterized.TestCase):
    """Compressed gradients across workers, in several buckets, over either transport.

    Each step's gradient is rounded once to the wire dtype (relative error
    2^-11 for fp16, 2^-8 for bf16) before the float32 sum; over 8 Adam steps
    of lr 0.01 (each moving a weight by at most ~lr) the deviation from one
    process stays well inside these bounds. Observed: 1.6e-5 (fp16) and
    1.6e-4 (bf16), against 6e-8 without compression.
    """

    @parameterized.named_parameters(
        dict(testcase_name="fp16_grpc", compression="fp16", transport="grpc", atol=1e-3),
        dict(testcase_name="bf16_host_memory", compression="bf16", transport="auto", atol=1e-2),
    )
    def test_compression_matches_single_process_within_tolerance(
        self, compression, transport, atol
    ):
        workers = run_local_cluster(
            train,
            num_workers=2,
            # 512 bytes: most gradients travel in a bucket of their own.
            args=(True, {"compression": compression, "bucket_bytes": 512, "transport": transport}),
            timeout_s=CLUSTER_TIMEOUT_S,
        )
        reference = train(False)
        for worker in workers:
            if transport == "auto":  # Several buckets a step through the group: 2 epochs of 4 steps.
                self.assertEqual(worker["transport"], "host_memory")
                self.assertGreaterEqual(worker["host_calls"], 2 * 4 * 2)
            else:
                self.assertEqual((worker["transport"], worker["host_calls"]), ("grpc", 0))
        self.assertEqual(workers[0]["host_calls"], workers[1]["host_calls"])
        _assert_fit_matches(self, workers, reference, rtol=0, atol=atol)
        deviation = max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(workers[0]["weights"], reference["weights"])
        )
        # Beyond float32 rounding: the wire dtype really was compressed.
        self.assertGreater(deviation, FLOAT32_ATOL)


class GrpcMultiWorkerFitTest(tf.test.TestCase):
    """transport="grpc": gradient buckets and logged values cross workers in TF's collectives.

    Several buckets of different sizes (512 bytes each at most), the logged
    values riding in the first (the path of workers on several hosts).
    """

    def test_fit_matches_single_process_through_tf_collectives(self):
        workers = run_local_cluster(
            train,
            num_workers=2,
            args=(True, {"transport": "grpc", "bucket_bytes": 512}),
            timeout_s=CLUSTER_TIMEOUT_S,
        )
        for worker in workers:
            self.assertEqual((worker["transport"], worker["host_calls"]), ("grpc", 0))
        _assert_fit_matches(self, workers, train(False), rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL)


def _assert_fit_matches(test, workers, reference, *, rtol, atol):
    """Both workers' weights equal; weights, loss and evaluate within tolerance of one process."""
    for a, b in zip(workers[0]["weights"], workers[1]["weights"]):
        test.assertAllEqual(a, b)
    for a, b in zip(workers[0]["weights"], reference["weights"]):
        test.assertAllClose(a, b, rtol=rtol, atol=atol)
    for worker in workers:
        test.assertAllClose(worker["loss"], reference["loss"], rtol=FLOAT32_RTOL, atol=atol)
        test.assertAllClose(worker["evaluate"], reference["evaluate"], rtol=FLOAT32_RTOL, atol=atol)


def _transport_in_own_shm(transport: str) -> str:
    """In each task: the transport its strategy takes with a /dev/shm of its own (as in separate containers)."""
    host_memory.DIRECTORY = tempfile.mkdtemp()
    try:
        return tfdist.MultiWorkerMirroredStrategy(timeout_s=60, transport=transport).transport
    except errors.ConfigError as e:
        return f"ConfigError: {e}"


class TransportChoiceTest(tf.test.TestCase):
    """What "auto" and "host_memory" do when workers on one host do not share /dev/shm."""

    def test_auto_takes_grpc_in_every_task(self):
        self.assertEqual(
            list(run_local_cluster(_transport_in_own_shm, num_workers=2, args=("auto",), timeout_s=CLUSTER_TIMEOUT_S)),
            ["grpc", "grpc"],
        )

    # In make test-all only (CI's time): the same check as above, with the error path.
    @pytest.mark.extended
    def test_host_memory_raises_config_error_in_every_task(self):
        results = run_local_cluster(
            _transport_in_own_shm, num_workers=2, args=("host_memory",), timeout_s=CLUSTER_TIMEOUT_S
        )
        for task, result in zip(("worker:0", "worker:1"), results):
            self.assertRegex(result, rf"ConfigError: .*share \S+; {task} and its peers do not all see each other's files")


def _embedding_model(keras):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((5,), dtype="int32"),
        keras.layers.Embedding(50, 4),
        keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(2),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _sync_batch_norm_model(keras):
    keras.utils.set_random_seed(4)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16),
        keras.layers.BatchNormalization(synchronized=True),
        keras.layers.Dense(3),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def train_more(use_strategy: bool, checkpoint_dir: str | None = None) -> dict[str, object]:
    """Sparse gradients, sync batch norm, gather and ModelCheckpoint, one strategy.

    The multi-worker claims of docs/multi_worker.md, each against one process with the same
    global batch (`use_strategy=False`).
    """
    keras = tf.keras
    strategy = (
        tfdist.MultiWorkerMirroredStrategy(timeout_s=60, bucket_bytes=None)
        if use_strategy
        else tf.distribute.get_strategy()
    )
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, size=(NUM_EXAMPLES, 5)).astype("int32")
    x = rng.normal(size=(NUM_EXAMPLES, 8)).astype("float32")
    y = rng.integers(0, 2, NUM_EXAMPLES).astype("int32")
    results: dict[str, object] = {}
    with strategy.scope():
        embedding = _embedding_model(keras)
    callbacks = []
    if checkpoint_dir is not None:
        callbacks.append(keras.callbacks.ModelCheckpoint(
            os.path.join(checkpoint_dir, "ckpt.weights.h5"), save_weights_only=True))
    embedding.fit(ids, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, shuffle=False,
                  verbose=0, callbacks=callbacks)
    results["embedding"] = embedding.get_weights()
    with strategy.scope():
        batch_norm = _sync_batch_norm_model(keras)
    batch_norm.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0)
    results["sync_batch_norm"] = batch_norm.get_weights()
    # A position embedding with Adam: rows of constant indices, summed over
    # the workers as one device sums them over the batch.
    keras.utils.set_random_seed(5)
    with strategy.scope():
        positions = position._build()
    position_x, position_y = position._data()
    positions.fit(position_x, position_y, batch_size=position.GLOBAL_BATCH_SIZE, epochs=2,
                  shuffle=False, verbose=0)
    results["position_embedding"] = positions.get_weights()
    # Clipped by norm: one device clips the whole batch's gradient. (Keras 3
    # clips before its own sum over the replicas; tfdist sums first.)
    with strategy.scope():
        clipped = tfdist.testing.small_classifier(keras.optimizers.SGD(0.5, clipnorm=0.05))
    clipped.fit(x, y, batch_size=GLOBAL_BATCH_SIZE, epochs=2, shuffle=False, verbose=0)
    results["clipnorm"] = clipped.get_weights()
    if use_strategy:
        task = strategy.cluster_config.worker_index

        @tf.function
        def gather():
            def replica_value():
                context = tf.distribute.get_replica_context()
                return tf.fill([2], tf.cast(task * 10 + context.replica_id_in_sync_group, tf.int32))

            return strategy.gather(strategy.run(replica_value), axis=0)

        results["gather"] = gather().numpy()
    return results


class MultiWorkerReadmeClaimsTest(tf.test.TestCase):
    """Sparse gradients (a position embedding's with Adam too), sync batch norm, gather,
    chief-only ModelCheckpoint, bucket_bytes=None, clipnorm."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.checkpoint_dir = tempfile.mkdtemp(prefix="mwms_checkpoint_")
        cls.workers = run_local_cluster(
            train_more, num_workers=2, args=(True, cls.checkpoint_dir),
            timeout_s=CLUSTER_TIMEOUT_S,
        )
        cls.reference = train_more(False)

    def _assert_matches_reference(self, name):
        for worker in self.workers:
            for a, b in zip(worker[name], self.reference[name]):
                self.assertAllClose(a, b, rtol=FLOAT32_RTOL, atol=FLOAT32_ATOL)

    def test_embedding_sparse_gradients_match_single_process(self):
        self._assert_matches_reference("embedding")

    def test_position_embedding_with_adam_matches_single_process(self):
        for worker in self.workers:
            for a, b in zip(worker["position_embedding"], self.reference["position_embedding"]):
                self.assertAllClose(a, b, rtol=position.RTOL, atol=position.ATOL)

    def test_clipnorm_clips_the_global_gradient_as_one_device(self):
        self._assert_matches_reference("clipnorm")

    def test_sync_batch_norm_matches_single_process(self):
        self._assert_matches_reference("sync_batch_norm")

    def test_gather_collects_every_replica_in_worker_order(self):
        for worker in self.workers:
            self.assertAllEqual(worker["gather"], [0, 0, 11, 11])

    def test_only_the_chief_writes_model_checkpoints(self):
        self.assertEqual(os.listdir(self.checkpoint_dir), ["ckpt.weights.h5"])


class MultiWorkerConfigTest(tf.test.TestCase):

    def test_invalid_tf_config_raises_cluster_config_error(self):
        with self.assertRaisesRegex(errors.ClusterConfigError, "index"):
            tfdist.MultiWorkerMirroredStrategy(
                '{"cluster": {"worker": ["127.0.0.1:1"]}, '
                '"task": {"type": "worker", "index": 3}}'
            )

    def test_ps_task_raises_config_error_before_starting(self):
        with self.assertRaisesRegex(errors.ConfigError, "ps:0"):
            tfdist.MultiWorkerMirroredStrategy(
                {
                    "cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                    "task": {"type": "ps", "index": 0},
                }
            )

    def test_unknown_compression_raises_config_error_before_starting(self):
        with self.assertRaisesRegex(errors.ConfigError, "compression='int8'"):
            tfdist.MultiWorkerMirroredStrategy(
                '{"cluster": {"worker": ["127.0.0.1:1"]}, '
                '"task": {"type": "worker", "index": 0}}',
                compression="int8",
            )

    def test_unknown_transport_raises_config_error_before_starting(self):
        with self.assertRaisesRegex(errors.ConfigError, r"transport='nccl'.*'auto', 'grpc', 'host_memory'"):
            tfdist.MultiWorkerMirroredStrategy(
                '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}',
                transport="nccl",
            )

    def test_host_memory_over_several_hosts_raises_config_error_before_starting(self):
        with self.assertRaisesRegex(errors.ConfigError, r"one host; received hosts \['node-a', 'node-b'\]"):
            tfdist.MultiWorkerMirroredStrategy(
                '{"cluster": {"worker": ["node-a:2222", "node-b:2222"]}, '
                '"task": {"type": "worker", "index": 0}}',
                transport="host_memory",
            )

    def test_non_positive_timeout_raises_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, "timeout_s=0"):
            tfdist.MultiWorkerMirroredStrategy(
                '{"cluster": {"worker": ["127.0.0.1:1"]}, '
                '"task": {"type": "worker", "index": 0}}',
                timeout_s=0,
            )


if __name__ == "__main__":
    tfdist.testing.main()
