"""Variables split over ps tasks (`variable_partitioner`) under tfdist.ParameterServerStrategy.

Two child processes, each an in-process cluster (2 workers): the first
(2 ps) builds an Embedding + Dense model under a `MinSizePartitioner`,
trains it with `fit` in sync mode next to the same model on one device
(built from the same seed, it must draw the same initial weights; same
batches: the weights must match to float32 rounding), records where each shard and each optimizer slot lives and
writes a TF checkpoint; the second (3 ps, 3 shards per large variable)
builds the same model and restores that checkpoint. Under Keras 3 and
tf-keras alike.
"""

from __future__ import annotations

import os
import tempfile
import traceback

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

VOCABULARY = 1000
EMBEDDING_DIM = 16
TOKENS = 3
HIDDEN = 64
NUM_EXAMPLES = 512
BATCH_SIZE = 64
#: A variable of at least this many bytes is split (up to num_ps shards).
MIN_SHARD_BYTES = 4096
CLUSTER_TIMEOUT_S = 300
STRATEGY_TIMEOUT_S = 120
EPOCHS = 4
SEED = 5


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.integers(0, VOCABULARY, size=(NUM_EXAMPLES, TOKENS)).astype("int32")
    y = (x[:, 0] % 2).astype("int32")
    return x, y


def _build(keras, strategy):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((TOKENS,), dtype="int32"),
                keras.layers.Embedding(VOCABULARY, EMBEDDING_DIM),
                keras.layers.Flatten(),
                keras.layers.Dense(HIDDEN, activation="relu"),
                keras.layers.Dense(2),
            ]
        )
        model.compile(
            # Momentum: a slot per variable. (Adam's step normalises float32
            # rounding of a near-zero gradient up to its learning rate, so
            # it cannot be compared with one device to rounding.)
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    return model


def _large_variables(model) -> dict[str, object]:
    embedding, _, hidden, _ = model.layers
    return {"embedding": embedding.embeddings, "kernel": hidden.kernel}


def _placement(strategy, variable) -> list[str]:
    """The device of each shard, in shard order (one entry if whole)."""
    return [shard.device.split("/device")[0] for shard in strategy.variable_shards(variable)]


def _slot_rows(strategy, model) -> list[tuple[str, int]]:
    """(ps task, rows) of every optimizer variable (or shard of one) of the embedding's width."""
    found = []
    for variable in model.optimizer.variables:
        for part in strategy.variable_shards(variable):
            if part.shape.rank == 2 and part.shape[1] == EMBEDDING_DIM:
                found.append((part.device.split("/device")[0], int(part.shape[0])))
    return found


def _strategy(num_ps: int, mode: str = "async"):
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=num_ps)
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=MIN_SHARD_BYTES, max_shards=num_ps
    )
    return tfdist.ParameterServerStrategy(
        config, mode=mode, timeout_s=STRATEGY_TIMEOUT_S, variable_partitioner=partitioner
    )


def train_and_save(checkpoint_prefix: str) -> dict[str, object]:
    """Child 1 (2 ps): fit, placement, checkpoint."""
    keras = tf.keras
    strategy = _strategy(num_ps=2, mode="sync")
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)
    keras.utils.set_random_seed(SEED)
    model = _build(keras, strategy)
    keras.utils.set_random_seed(SEED)
    one_device = _build(keras, tf.distribute.get_strategy())
    record: dict[str, object] = {
        "initial_weights": model.get_weights(),
        "one_device_initial_weights": one_device.get_weights(),
    }
    one_device.set_weights(model.get_weights())
    try:
        history = model.fit(dataset, epochs=EPOCHS, verbose=0)
    except Exception as e:  # noqa: BLE001 - reported to the test.
        record["unexpected"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
        return record
    one_device.fit(dataset, epochs=EPOCHS, verbose=0)
    record["weights"] = model.get_weights()
    record["one_device_weights"] = one_device.get_weights()
    record["files"] = _weight_files(keras, strategy, model, os.path.dirname(checkpoint_prefix))
    record["slot_rows"] = _slot_rows(strategy, model)
    large = _large_variables(model)
    record["placement"] = {name: _placement(strategy, v) for name, v in large.items()}
    record["values"] = {name: tf.convert_to_tensor(v).numpy() for name, v in large.items()}
    record["loss"] = history.history["loss"]
    record["iterations"] = int(model.optimizer.iterations.numpy())
    record["evaluate"] = model.evaluate(x, y, batch_size=BATCH_SIZE, verbose=0)
    record["checkpoint"] = tf.train.Checkpoint(model=model).write(checkpoint_prefix)
    # A table sharded by consistent hashing instead: one shard per ps. A
    # subclassed model: Keras 3 builds it symbolically inside fit and creates
    # its variables late, outside the layer's build.
    class Hashed(keras.Model):
        def __init__(self):
            super().__init__()
            self.table = tfdist.layers.ConsistentHashEmbedding(VOCABULARY, EMBEDDING_DIM)
            self.flatten = keras.layers.Flatten()
            self.logits = keras.layers.Dense(2)

        def call(self, inputs):
            return self.logits(self.flatten(self.table(inputs)))

    with strategy.scope():
        hashed_model = Hashed()
        hashed = hashed_model.table
        hashed_model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    record["hashed_loss"] = hashed_model.fit(dataset, epochs=EPOCHS, verbose=0).history["loss"]
    record["hashed_placement"] = [_placement(strategy, shard)[0] for shard in hashed.shards]
    return record


def _weight_files(keras, strategy, model, directory: str) -> dict[str, object]:
    """Weights files of the split model loaded on one device, and one device's into a split model."""
    found: dict[str, object] = {}
    suffixes = [".weights.h5"] if keras.__name__.startswith("keras") else [".weights.h5", ".h5"]
    for suffix in suffixes:
        path = os.path.join(directory, "split" + suffix)
        model.save_weights(path)
        one_device = _build(keras, tf.distribute.get_strategy())
        one_device.load_weights(path)
        found[f"split{suffix} on one device"] = one_device.get_weights()
        one_device.set_weights([np.full_like(w, 0.25) for w in one_device.get_weights()])
        path = os.path.join(directory, "one_device" + suffix)
        one_device.save_weights(path)
        split = _build(keras, strategy)
        split.load_weights(path)
        found[f"one_device{suffix} split"] = split.get_weights()
    table = model.layers[0]
    try:
        table.set_weights([np.zeros((VOCABULARY - 1, EMBEDDING_DIM), "float32")])
    except ValueError as e:
        found["bad shape"] = f"{type(e).__module__}.{type(e).__name__}: {e}"
    return found


def restore(checkpoint_path: str) -> dict[str, object]:
    """Child 2 (3 ps): the same model, restored from child 1's checkpoint."""
    keras = tf.keras
    strategy = _strategy(num_ps=3)
    x, y = _data()
    model = _build(keras, strategy)
    tf.train.Checkpoint(model=model).read(checkpoint_path).assert_existing_objects_matched()
    large = _large_variables(model)
    return {
        "placement": {name: _placement(strategy, v) for name, v in large.items()},
        "values": {name: tf.convert_to_tensor(v).numpy() for name, v in large.items()},
        "evaluate": model.evaluate(x, y, batch_size=BATCH_SIZE, verbose=0),
    }


def _ps(*indices: int) -> list[str]:
    return [f"/job:ps/replica:0/task:{i}" for i in indices]


class ShardedVariablesTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        directory = tempfile.mkdtemp(prefix="tfdist-ps-sharded-")
        (cls.trained,) = tfdist.testing.run_local_cluster(
            train_and_save,
            num_workers=1,
            args=(os.path.join(directory, "ckpt"),),
            timeout_s=CLUSTER_TIMEOUT_S,
        )
        cls.restored = None
        if "checkpoint" in cls.trained:
            (cls.restored,) = tfdist.testing.run_local_cluster(
                restore,
                num_workers=1,
                args=(cls.trained["checkpoint"],),
                timeout_s=CLUSTER_TIMEOUT_S,
            )

    def setUp(self):
        super().setUp()
        self.assertNotIn("unexpected", self.trained, self.trained.get("unexpected"))

    def test_large_variables_are_split_over_both_ps_tasks(self):
        placement = self.trained["placement"]
        for name in ("embedding", "kernel"):
            self.assertCountEqual(placement[name], _ps(0, 1), name)

    def test_optimizer_slots_are_split_like_their_variable(self):
        # The momentum of the (1000, 16) table: in shards on both ps tasks,
        # not whole on one.
        rows = self.trained["slot_rows"]
        self.assertCountEqual({task for task, _ in rows}, _ps(0, 1))
        self.assertEqual(sum(count for _, count in rows), VOCABULARY)
        self.assertLess(max(count for _, count in rows), VOCABULARY)

    def test_split_variables_start_from_one_devices_values_with_the_same_seed(self):
        # tf-keras's initializers drew each shard on its own (other values).
        for split, whole in zip(
            self.trained["initial_weights"], self.trained["one_device_initial_weights"]
        ):
            np.testing.assert_array_equal(split, whole)

    def test_fit_with_split_variables_equals_one_device(self):
        for split, whole in zip(self.trained["weights"], self.trained["one_device_weights"]):
            np.testing.assert_allclose(split, whole, rtol=1e-5, atol=1e-6)
        loss = self.trained["loss"]
        self.assertLess(loss[-1], loss[0])
        self.assertEqual(self.trained["iterations"], EPOCHS * NUM_EXAMPLES // BATCH_SIZE)

    def test_get_weights_lists_each_split_variable_whole_as_one_device(self):
        shapes = [w.shape for w in self.trained["weights"]]
        self.assertEqual(shapes, [w.shape for w in self.trained["one_device_weights"]])
        self.assertEqual(shapes[0], (VOCABULARY, EMBEDDING_DIM))

    def test_weight_files_load_across_split_and_one_device(self):
        files = self.trained["files"]
        for suffix in [".weights.h5"] + ([] if harness.KERAS_3 else [".h5"]):
            for got, expected in zip(files[f"split{suffix} on one device"], self.trained["weights"]):
                np.testing.assert_array_equal(got, expected, err_msg=suffix)
            for got in files[f"one_device{suffix} split"]:
                np.testing.assert_array_equal(got, np.full_like(got, 0.25), err_msg=suffix)

    def test_set_weights_of_the_wrong_shape_is_refused(self):
        message = self.trained["files"]["bad shape"]
        self.assertIn("999", message)
        if not harness.KERAS_3:
            self.assertTrue(message.startswith("tfdist.errors.ConfigError"), message)
            self.assertIn("whole shape is (1000, 16)", message)

    def test_consistent_hash_table_has_one_shard_per_ps_and_trains(self):
        self.assertEqual(self.trained["hashed_placement"], _ps(0, 1))
        loss = self.trained["hashed_loss"]
        self.assertLess(loss[-1], loss[0])

    def test_checkpoint_of_two_ps_restores_into_three(self):
        restored = self.restored
        for name in ("embedding", "kernel"):
            self.assertCountEqual(restored["placement"][name], _ps(0, 1, 2), name)
            np.testing.assert_array_equal(
                restored["values"][name], self.trained["values"][name], err_msg=name
            )
        np.testing.assert_allclose(restored["evaluate"], self.trained["evaluate"], rtol=1e-5)

if __name__ == "__main__":
    tfdist.testing.main()
