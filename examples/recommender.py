"""Trains a matrix-factorisation recommender on parameter servers with tfdist.

A single-device Keras script plus the lines marked `# tfdist:`. The user
embedding table has --num_users rows (default 1,000,000: 64 MB of float32
at --dim=16), split over the ps tasks by tfdist's default partitioner
(variables of more than 1 MiB, by rows); each step looks up
only the rows of its batch on the ps tasks that own them, and SGD writes
only those rows back (sparse updates).

Data: by default SYNTHETIC clicks drawn from a known latent model, not real
users. User u has a latent vector p_u ~ N(0, I_k), item i has q_i ~ N(0,
I_k) and a bias b_i (k = --latent_dim); a click on (u, i) has probability
sigmoid(p_u . q_i + b_i). --active_users users, spread over the
whole table, make --interactions clicks or non-clicks on --num_items
items. The latent model's own accuracy (the best any model can reach) is
printed next to the model's. Your own data: --interactions_file=clicks.csv
with rows `user,item,label` (ids below --num_users and --num_items; label
0 or 1).

    python examples/recommender.py            # no TF_CONFIG: in-process cluster, 2 workers, 2 ps
    python -m tfdist.launch --chief --workers 2 --ps 2 -- python -u examples/recommender.py
    python examples/recommender.py --strategy=single   # one device, to compare

Prints where the user table's shards live, Keras's per-epoch log (with
validation accuracy), then the test accuracy next to the best possible and
the examples/s of the whole `fit` (tracing and validation included).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
from tensorflow import keras  # Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1.

import tfdist

flags.DEFINE_enum(
    "strategy", "parameter_server", ["parameter_server", "single"],
    "parameter_server: tfdist.ParameterServerStrategy (asynchronous) over the "
    "TF_CONFIG cluster (chief, workers, ps), or without TF_CONFIG an "
    "in-process cluster of 2 workers and 2 ps; single: one device.")
flags.DEFINE_integer(
    "num_users", 1_000_000, "Rows of the user embedding table.", lower_bound=1)
flags.DEFINE_integer("num_items", 1000, "Rows of the item table.", lower_bound=1)
flags.DEFINE_integer("dim", 16, "Embedding width.", lower_bound=1)
flags.DEFINE_integer(
    "active_users", 5000, "Synthetic data: users that interact.", lower_bound=1)
flags.DEFINE_integer(
    "interactions", 400_000, "Synthetic data: interactions drawn.", lower_bound=10)
flags.DEFINE_integer(
    "latent_dim", 4, "Synthetic data: width k of the true latent vectors.", lower_bound=1)
flags.DEFINE_string(
    "interactions_file", None, "A CSV of `user,item,label` rows instead of synthetic data.")
flags.DEFINE_integer("batch_size", 256, "Examples per step.", lower_bound=1)
flags.DEFINE_integer("epochs", 3, "Training epochs.", lower_bound=1)
flags.DEFINE_integer(
    "steps", None, "If set, stop each epoch after this many steps (smoke runs).",
    lower_bound=1)
flags.DEFINE_float(
    "learning_rate", 30.0,
    "SGD learning rate (sparse row updates; high, as each row is in few batches "
    "and the loss is a batch mean).", lower_bound=0.0)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    strategy: str = "parameter_server"
    num_users: int = 1_000_000
    num_items: int = 1000
    dim: int = 16
    active_users: int = 5000
    interactions: int = 400_000
    latent_dim: int = 4
    interactions_file: str | None = None
    batch_size: int = 256
    epochs: int = 3
    steps: int | None = None
    learning_rate: float = 30.0


@dataclasses.dataclass(frozen=True)
class TrainResult:
    test_accuracy: float
    best_possible_accuracy: float | None
    examples_per_second: float
    user_table_shards: int


def synthetic_interactions(config: TrainConfig):
    """(users, items, labels, best accuracy): clicks from the known latent model above."""
    rng = np.random.default_rng(0)
    active = rng.choice(config.num_users, size=min(config.active_users, config.num_users),
                        replace=False)
    users = rng.choice(active, size=config.interactions)
    items = rng.integers(0, config.num_items, size=config.interactions)
    k = config.latent_dim
    # Latent vectors of the active users only (the others never interact).
    user_vectors = dict(zip(active.tolist(), rng.normal(size=(len(active), k))))
    item_vectors = rng.normal(size=(config.num_items, k))
    item_bias = rng.normal(scale=0.5, size=config.num_items)
    logits = np.einsum("nk,nk->n", np.stack([user_vectors[u] for u in users.tolist()]),
                       item_vectors[items]) + item_bias[items]
    probability = 1.0 / (1.0 + np.exp(-logits))
    labels = (rng.random(config.interactions) < probability).astype("float32")
    best = float(np.mean(np.maximum(probability, 1.0 - probability)))
    return users.astype("int64"), items.astype("int64"), labels, best


def load_interactions(config: TrainConfig):
    """(users, items, labels, best accuracy or None): the CSV, or synthetic data."""
    if config.interactions_file is None:
        return synthetic_interactions(config)
    rows = np.loadtxt(config.interactions_file, delimiter=",", ndmin=2)
    return rows[:, 0].astype("int64"), rows[:, 1].astype("int64"), rows[:, 2].astype("float32"), None


def build_model(config: TrainConfig):
    user = keras.Input((), dtype="int64", name="user")
    item = keras.Input((), dtype="int64", name="item")
    user_vector = keras.layers.Embedding(config.num_users, config.dim, name="user_embedding")(user)
    item_vector = keras.layers.Embedding(config.num_items, config.dim, name="item_embedding")(item)
    item_bias = keras.layers.Embedding(config.num_items, 1, name="item_bias")(item)
    logit = keras.layers.Add()([keras.layers.Dot(axes=1)([user_vector, item_vector]), item_bias])
    model = keras.Model({"user": user, "item": item}, logit)
    model.compile(
        optimizer=keras.optimizers.SGD(config.learning_rate),  # Sparse row updates.
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)])
    return model


def make_strategy(config: TrainConfig):
    if config.strategy == "single":
        return tf.distribute.get_strategy()
    cluster = None  # tfdist: chief, workers and ps from TF_CONFIG.
    if tfdist.cluster.parse_tf_config().is_local:
        # The script restarts here, in a private network (the servers' ports
        # unreachable from outside), and prints what follows once.
        cluster = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
        print("No TF_CONFIG cluster: training on an in-process cluster of 2 workers "
              "and 2 ps. For separate processes run:\n  python -m tfdist.launch "
              "--chief --workers 2 --ps 2 -- python -u examples/recommender.py", flush=True)
    # tfdist: on worker and ps tasks this serves and never returns. Variables
    # of more than 1 MiB (the user table) are split over the ps tasks by rows.
    return tfdist.ParameterServerStrategy(cluster)


def describe_shards(strategy, variable) -> list[str]:
    """Where each shard of a (possibly split) variable lives, with its rows."""
    if not isinstance(strategy, tfdist.ParameterServerStrategy):
        return [f"  rows 0-{int(variable.shape[0]) - 1:,} on this device"]
    lines, start = [], 0
    for shard in strategy.variable_shards(variable):
        rows = int(shard.shape[0])
        task = shard.device.split("/device")[0].replace("/replica:0", "")
        lines.append(f"  rows {start:,}-{start + rows - 1:,} on {task}")
        start += rows
    return lines


def train(config: TrainConfig) -> TrainResult:
    strategy = make_strategy(config)  # First: on worker and ps tasks it serves.
    users, items, labels, best = load_interactions(config)
    labels = labels.reshape(-1, 1)  # As the model's (batch, 1) logits.
    split = int(0.9 * len(labels))
    features = {"user": users, "item": items}
    train_x = {name: values[:split] for name, values in features.items()}
    test_x = {name: values[split:] for name, values in features.items()}
    train_data = (tf.data.Dataset.from_tensor_slices((train_x, labels[:split]))
                  .shuffle(100_000).batch(config.batch_size))
    test_data = tf.data.Dataset.from_tensor_slices((test_x, labels[split:])).batch(4096)

    with strategy.scope():  # tfdist: the tables are created on the ps tasks.
        model = build_model(config)
    table = model.get_layer("user_embedding").embeddings
    shards = describe_shards(strategy, table)
    print(f"user_embedding {tuple(table.shape)}: {len(shards)} shard(s)", flush=True)
    print("\n".join(shards), flush=True)

    start = time.perf_counter()
    model.fit(train_data, epochs=config.epochs, steps_per_epoch=config.steps,
              validation_data=test_data, verbose=2)
    seconds = time.perf_counter() - start  # Tracing and validation included.
    steps = config.steps or -(-split // config.batch_size)
    _, accuracy = model.evaluate(test_data, verbose=0)
    result = TrainResult(float(accuracy), best,
                         config.epochs * steps * config.batch_size / seconds, len(shards))
    best_text = f"{best:.4f}" if best is not None else "unknown (your data)"
    print(f"test_accuracy={result.test_accuracy:.4f} best_possible_accuracy={best_text} "
          f"examples_per_second={result.examples_per_second:,.0f} "
          f"user_table_shards={result.user_table_shards}", flush=True)
    return result


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # Each TrainConfig field has the flag of the same name.
    train(TrainConfig(**{field.name: flags.FLAGS[field.name].value
                         for field in dataclasses.fields(TrainConfig)}))


if __name__ == "__main__":
    app.run(main)
