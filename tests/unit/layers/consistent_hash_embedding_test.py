"""tfdist.layers.ConsistentHashEmbedding against keras.layers.Embedding, without a cluster.

With the same table, lookups and an SGD step equal a Keras `Embedding`'s;
Keras 3 weight files hold the whole table, so 2 shards load into 3. The
shards' placement on ps tasks is tested through `fit` in
tests/integration/parameter_server_sharded_test.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import errors
from tfdist.layers import ConsistentHashEmbedding
from tests.front_end import KERAS_3

keras = tf.keras
ROWS, DIM = 50, 4


def _pair(num_shards: int = 3):
    """A Keras Embedding and a ConsistentHashEmbedding holding the same table."""
    ids = keras.Input((2,), dtype="int32")
    plain = keras.Model(ids, keras.layers.Embedding(ROWS, DIM)(ids))
    hashed_layer = ConsistentHashEmbedding(ROWS, DIM, num_shards=num_shards)
    hashed = keras.Model(ids, hashed_layer(ids))
    hashed_layer.set_table(plain.layers[1].get_weights()[0])
    return plain, hashed, hashed_layer


class ConsistentHashEmbeddingTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.ids = np.random.default_rng(0).integers(0, ROWS, size=(16, 2)).astype("int32")

    def test_lookup_equals_keras_embedding(self):
        plain, hashed, layer = _pair()
        self.assertLen(layer.shards, 3)
        self.assertEqual(sum(int(s.shape[0]) for s in layer.shards), ROWS)
        self.assertAllEqual(hashed(self.ids), plain(self.ids))

    def test_sgd_step_equals_keras_embedding(self):
        plain, hashed, layer = _pair()
        y = np.random.default_rng(1).normal(size=(16, 2, DIM)).astype("float32")
        for model in (plain, hashed):
            model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
            model.fit(self.ids, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        self.assertAllClose(layer.table(), plain.layers[1].get_weights()[0], rtol=1e-6)

    @pytest.mark.skipif(not KERAS_3, reason="Keras 3's weight files (save_own_variables)")
    def test_weights_of_two_shards_load_into_three(self):
        _, two, two_layer = _pair(num_shards=2)
        path = os.path.join(self.create_tempdir().full_path, "table.weights.h5")
        two.save_weights(path)
        _, three, three_layer = _pair(num_shards=3)
        three.load_weights(path)
        self.assertAllEqual(three_layer.table(), two_layer.table())

    def test_bad_size_raises_config_error_naming_it(self):
        with self.assertRaisesRegex(errors.ConfigError, "num_shards=0"):
            ConsistentHashEmbedding(ROWS, DIM, num_shards=0)
        with self.assertRaisesRegex(errors.ConfigError, r"table must have shape \(50, 4\)"):
            _pair()[2].set_table(np.zeros((ROWS + 1, DIM)))


if __name__ == "__main__":
    tfdist.testing.main()
