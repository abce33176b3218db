"""keras-io's "Text classification with Transformer", tensor-parallel with tfdist.

A port of keras-team/keras-io examples/nlp/text_classification_with_transformer.py:
the same model (a token embedding plus a position embedding, one transformer
block: multi-head self-attention, a two-layer feed-forward network, residual
layer norms; mean over time, Dense(20, relu), Dense(2, softmax)), compile and
fit. By default on synthetic token sequences (IMDB is a download): each is
labelled by whether its low tokens outnumber its high ones. A single-device
Keras script plus the lines marked `# tfdist:`.

    python examples/transformer.py                   # mesh 1x4: each layer split 4 ways
    python examples/transformer.py --mesh=2x2        # hybrid: batch split 2 ways, layers 2 ways
    python examples/transformer.py --mesh=1x2 --simulate_cpu_devices=2
    python examples/transformer.py --strategy=mirrored   # data parallel, to compare
    python examples/transformer.py --strategy=single     # one device
    python examples/transformer.py --data_path=my.npz    # your own: x (N, maxlen) token ids, y (N,)
    TF_USE_LEGACY_KERAS=1 python examples/transformer.py --dropout=0   # tf-keras

With --strategy=mesh the layouts are chosen automatically (Megatron's rules:
attention by heads, the feed-forward pair column- then row-parallel,
embedding tables by rows), and the layout report says what each variable
got and why. Under tf-keras (TF_USE_LEGACY_KERAS=1) the mesh needs
--dropout=0: tf-keras's Dropout draws with stateful random ops, which TF's
DTensor refuses (the strategy says so); its embedding tables stay whole.

Prints Keras's progress, then per-epoch validation accuracy and examples/s,
the layout report (mesh), and the test accuracy.
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

_STRATEGY = flags.DEFINE_enum(
    "strategy", "mesh", ["mesh", "mirrored", "single"],
    "mesh: tfdist.MeshStrategy over --mesh with automatic layouts; mirrored: "
    "tfdist.MirroredStrategy (data parallel) over the same devices; single: one "
    "device, no strategy.")
_SIMULATE_CPU_DEVICES = flags.DEFINE_integer(
    "simulate_cpu_devices", 4,
    "Split the CPU into this many logical devices (0: use real devices).", lower_bound=0)
_MESH = flags.DEFINE_string(
    "mesh", "1x4",
    "BATCHxMODEL devices (--strategy=mesh): BATCH rows each take a slice of every "
    "batch, MODEL columns each hold a slice of every large layer; BATCH * MODEL "
    "must be the number of devices.")
_MAXLEN = flags.DEFINE_integer("maxlen", 64, "Tokens per sequence.", lower_bound=1)
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 2000, "Token ids are below it.", lower_bound=2)
_EMBED_DIM = flags.DEFINE_integer("embed_dim", 32, "Embedding size of each token.", lower_bound=1)
_NUM_HEADS = flags.DEFINE_integer(
    "num_heads", 4, "Attention heads (split over the mesh's model axis where it divides them).",
    lower_bound=1)
_FF_DIM = flags.DEFINE_integer(
    "ff_dim", 64, "Hidden layer size of the feed-forward network.", lower_bound=1)
_NUM_EXAMPLES = flags.DEFINE_integer(
    "num_examples", 4096, "Synthetic sequences (80% train, 20% test).", lower_bound=10)
_GLOBAL_BATCH_SIZE = flags.DEFINE_integer(
    "global_batch_size", 64, "Batch size summed over all replicas.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 3, "Training epochs.", lower_bound=1)
_DROPOUT = flags.DEFINE_float("dropout", 0.1, "Dropout rate (keras-io's 0.1).", lower_bound=0, upper_bound=0.99)
_STEPS = flags.DEFINE_integer(
    "steps", None, "If set, stop each epoch after this many steps (smoke runs).", lower_bound=1)
_DATA_PATH = flags.DEFINE_string(
    "data_path", None,
    "An .npz file with arrays `x` (N, maxlen) of token ids below --vocab_size and `y` "
    "(N,) labels 0/1; default: synthetic sequences.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    strategy: str = "mesh"
    simulate_cpu_devices: int = 4
    mesh: str = "1x4"
    maxlen: int = 64
    vocab_size: int = 2000
    embed_dim: int = 32
    num_heads: int = 4
    ff_dim: int = 64
    num_examples: int = 4096
    global_batch_size: int = 64
    epochs: int = 3
    dropout: float = 0.1
    steps: int | None = None
    data_path: str | None = None


@dataclasses.dataclass(frozen=True)
class TrainResult:
    test_accuracy: float
    examples_per_second: float


class TransformerBlock(keras.layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [keras.layers.Dense(ff_dim, activation="relu"), keras.layers.Dense(embed_dim)])
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs, training=None):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(keras.layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = x.shape[-1]
        positions = self.pos_emb(tf.range(start=0, limit=maxlen, delta=1))
        return self.token_emb(x) + positions


def build_model(config: TrainConfig):
    inputs = keras.layers.Input(shape=(config.maxlen,), dtype="int32")
    x = TokenAndPositionEmbedding(config.maxlen, config.vocab_size, config.embed_dim)(inputs)
    x = TransformerBlock(config.embed_dim, config.num_heads, config.ff_dim, rate=config.dropout)(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(config.dropout)(x)
    x = keras.layers.Dense(20, activation="relu")(x)
    x = keras.layers.Dropout(config.dropout)(x)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def load_data(config: TrainConfig):
    """(x_train, y_train), (x_test, y_test): synthetic sequences, or the user's .npz."""
    if config.data_path:
        with np.load(config.data_path) as data:
            x, y = data["x"].astype("int32"), data["y"].astype("int32")
    else:
        rng = np.random.default_rng(0)
        x = rng.integers(1, config.vocab_size, (config.num_examples, config.maxlen)).astype("int32")
        low = np.sum(x < config.vocab_size // 2, axis=1)
        y = (2 * low > config.maxlen).astype("int32")
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


class Throughput(keras.callbacks.Callback):
    """Examples/s of each epoch's training steps (validation excluded)."""

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.rates: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.steps = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        self.end = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        rate = self.steps * self.global_batch_size / (self.end - self.start)
        self.rates.append(rate)
        print(f"epoch {epoch + 1}: val_accuracy={logs.get('val_accuracy', float('nan')):.4f} "
              f"examples/s={rate:,.0f}", flush=True)


def make_strategy(config: TrainConfig):
    if config.strategy == "single":
        return tf.distribute.get_strategy()
    if config.strategy == "mirrored":
        return tfdist.MirroredStrategy()  # tfdist: data parallel over all local devices.
    rows, columns = (int(n) for n in config.mesh.lower().split("x"))
    # tfdist: layout_map=None: Megatron's layouts, chosen as the model is built.
    return tfdist.MeshStrategy({"batch": rows, "model": columns}, layout_map=None)


def train(config: TrainConfig) -> TrainResult:
    if config.simulate_cpu_devices:
        tfdist.simulate_cpu_devices(config.simulate_cpu_devices)  # tfdist: N logical CPUs.
    (x_train, y_train), (x_test, y_test) = load_data(config)
    strategy = make_strategy(config)
    print(f"strategy={config.strategy} replicas={strategy.num_replicas_in_sync} "
          f"global_batch_size={config.global_batch_size}", flush=True)
    with strategy.scope():  # tfdist: variables created here are laid out or mirrored.
        model = build_model(config)
    throughput = Throughput(config.global_batch_size)
    model.fit(x_train, y_train, batch_size=config.global_batch_size, epochs=config.epochs,
              steps_per_epoch=config.steps, validation_data=(x_test, y_test),
              callbacks=[throughput], verbose=2)
    _, accuracy = model.evaluate(x_test, y_test, batch_size=config.global_batch_size, verbose=0)
    if config.strategy == "mesh":  # tfdist: how each variable is split, and why.
        print(strategy.layout_report(), flush=True)
    steady = throughput.rates[1:] or throughput.rates  # Epoch 1 includes tracing.
    result = TrainResult(float(accuracy), float(np.median(steady)))
    print(f"test_accuracy={result.test_accuracy:.4f} "
          f"examples_per_second={result.examples_per_second:,.0f}", flush=True)
    return result


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    train(TrainConfig(
        strategy=_STRATEGY.value,
        simulate_cpu_devices=_SIMULATE_CPU_DEVICES.value,
        mesh=_MESH.value,
        maxlen=_MAXLEN.value,
        vocab_size=_VOCAB_SIZE.value,
        embed_dim=_EMBED_DIM.value,
        num_heads=_NUM_HEADS.value,
        ff_dim=_FF_DIM.value,
        num_examples=_NUM_EXAMPLES.value,
        global_batch_size=_GLOBAL_BATCH_SIZE.value,
        epochs=_EPOCHS.value,
        dropout=_DROPOUT.value,
        steps=_STEPS.value,
        data_path=_DATA_PATH.value,
    ))


if __name__ == "__main__":
    app.run(main)
