"""`ConsistentHashEmbedding`: an Embedding whose rows are spread over shards by consistent hashing.

TF's partitioners split a table into row ranges, one per ps task: going
from 2 ps tasks to 3 changes the owner of about half of all rows. Here a
row belongs to the shard that `hash_ring.HashRing` assigns it, so with one
more shard only the rows the new shard takes over change owner (about 1/3
from 2 to 3), which is what a table whose row space grows with the cluster
needs. (Loading a saved table rewrites every shard; the ring bounds which
rows a resharding has to move, for a mover that moves only those.)

    with strategy.scope():                  # tfdist.ParameterServerStrategy
        vectors = tfdist.layers.ConsistentHashEmbedding(1_000_000, 16)(user_ids)

Under `tfdist.ParameterServerStrategy`, shard i is one whole variable on ps
task i (mod the ps tasks); elsewhere all shards are local. A lookup sends
each id to its shard (`tf.dynamic_partition`), gathers there, and puts the
rows back in order (`tf.dynamic_stitch`): each ps gathers only its rows,
and each shard's gradient is the `IndexedSlices` of its rows. Keras weight
files (`save_weights`, `BackupAndRestore`, `ModelCheckpoint` under Keras 3)
hold the whole table in row order, so a table saved with N shards loads
into M; tf-keras and TF checkpoints save each shard, for the same shards.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist import errors
from tfdist._internal import keras_layers
from tfdist import _validation as validation
from tfdist.layers import hash_ring

__all__ = ["ConsistentHashEmbedding"]

keras = tf.keras  # Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1.
_Layer: Any = keras.layers.Layer


class ConsistentHashEmbedding(_Layer):
    """Maps integer ids in [0, input_dim) to vectors, the table sharded by consistent hashing.

    Args:
      input_dim: Rows of the table (ids are 0..input_dim-1).
      output_dim: Width of each vector.
      num_shards: Shards; default: the ps tasks of the current
        `tfdist.ParameterServerStrategy`, else 1.
      virtual_nodes: Points per shard on the hash ring.
      embeddings_initializer: Initializer of the rows (Keras's, by name or
        object).
      **kwargs: Passed to `keras.layers.Layer`.

    Raises:
      TypeError: If a size is not an int.
      ConfigError: If a size is < 1.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        num_shards: int | None = None,
        virtual_nodes: int = hash_ring.DEFAULT_VIRTUAL_NODES,
        embeddings_initializer: Any = "uniform",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        validation.check_positive_int("input_dim", input_dim)
        validation.check_positive_int("output_dim", output_dim)
        if num_shards is not None:
            validation.check_positive_int("num_shards", num_shards)
        validation.check_positive_int("virtual_nodes", virtual_nodes)
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.num_shards = num_shards
        self.virtual_nodes = virtual_nodes
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, input_shape: Any) -> None:
        extended = tf.distribute.get_strategy().extended
        num_ps = int(getattr(extended, "num_ps", 0))
        shards = self.num_shards or max(1, num_ps)
        owners, local = hash_ring.HashRing(shards, self.virtual_nodes).assign(self.input_dim)
        # NumPy here; tensors only in `call` (Keras 3 may build in a throwaway graph).
        self._owners = owners.astype(np.int32)
        self._local = local.astype(np.int32)
        pin = getattr(extended, "pinned_to_ps", None)
        self.shards = []
        for shard in range(shards):
            ps = shard % num_ps if pin is not None and num_ps else None
            with contextlib.nullcontext() if pin is None or ps is None else pin(ps):
                variable = self.add_weight(
                    name=f"shard_{shard}",
                    shape=(int(np.count_nonzero(owners == shard)), self.output_dim),
                    initializer=self.embeddings_initializer,
                )
            if ps is not None:
                # Keras 3 may create the tf.Variable later, outside `pin`
                # (a model built symbolically): the strategy reads this then.
                extended.pin_variable(variable, ps)
            self.shards.append(variable)
        super().build(input_shape)

    def call(self, inputs: Any) -> Any:
        ids = tf.cast(inputs, tf.int32)
        flat = tf.reshape(ids, [-1])
        # Constants of the traced function: sent to a worker once, with it.
        owner = tf.gather(tf.constant(self._owners), flat)
        index_in_shard = tf.gather(tf.constant(self._local), flat)
        rows = tf.dynamic_partition(index_in_shard, owner, len(self.shards))
        positions = tf.dynamic_partition(tf.range(tf.size(flat)), owner, len(self.shards))
        vectors = [
            tf.gather(keras_layers.storage_variable(shard), shard_rows)
            for shard, shard_rows in zip(self.shards, rows)
        ]
        stitched = tf.dynamic_stitch(positions, vectors)
        return tf.reshape(stitched, tf.concat([tf.shape(ids), [self.output_dim]], axis=0))

    def compute_output_shape(self, input_shape: Any) -> Any:
        return tuple(input_shape) + (self.output_dim,)

    def table(self) -> np.ndarray:
        """The whole table, in row order (reads every shard)."""
        parts = [np.asarray(shard.numpy()) for shard in self.shards]
        table = np.zeros((self.input_dim, self.output_dim), dtype=parts[0].dtype)
        for index, part in enumerate(parts):
            table[self._owners == index] = part
        return table

    def set_table(self, table: np.ndarray) -> None:
        """Assigns the whole table (row order) to the shards."""
        table = np.asarray(table)
        if table.shape != (self.input_dim, self.output_dim):
            raise errors.ConfigError(
                f"the table must have shape {(self.input_dim, self.output_dim)}; "
                f"received shape {table.shape}. Save and load tables of the same "
                "input_dim and output_dim."
            )
        for index, shard in enumerate(self.shards):
            shard.assign(table[self._owners == index])

    # Keras 3 weight files: the whole table, whatever the shards.
    def save_own_variables(self, store: Any) -> None:
        store["table"] = self.table()

    def load_own_variables(self, store: Any) -> None:
        self.set_table(store["table"])

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            input_dim=self.input_dim,
            output_dim=self.output_dim,
            num_shards=self.num_shards,
            virtual_nodes=self.virtual_nodes,
            embeddings_initializer=keras.initializers.serialize(self.embeddings_initializer),
        )
        return config
