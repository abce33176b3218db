"""Trains a Keras MLP on scikit-learn's digits with tfdist: data- or model-parallel.

A single-device Keras script plus the lines marked `# tfdist:`.

    python examples/digits.py                       # 4 simulated CPUs, tfdist ring/tree/auto
    python examples/digits.py --strategy=tf_mirrored  # TF's built-in, to compare
    python examples/digits.py --data_path=my.npz    # your own data: arrays x (N, F), y (N,)
    python examples/digits.py --strategy=layer_placement --num_microbatches=4 --model=deep_mlp
        # the layers over 4 CPUs, pipelined; prints where each layer went
    python examples/digits.py --strategy=layer_placement --data_parallel=2 --model=deep_mlp
        # two copies of a 2-stage pipeline, each fed half of every batch
    python examples/digits.py --strategy=mesh --mesh=2x2   # batches over 2 rows (tf-keras: 1xN),
        # each hidden layer's weights split over 2 columns; prints every variable's layout
    python -m tfdist.launch --workers 2 -- python examples/digits.py --strategy=multi_worker
    python -m tfdist.launch --workers 2 -- python examples/digits.py --strategy=mesh \
        --mesh=2x2 --simulate_cpu_devices=2   # batch axis between the workers, layers split in each
    python -m tfdist.launch --chief --workers 2 --ps 2 -- python -u examples/digits.py \
        --strategy=parameter_server          # variables on 2 ps, steps on 2 workers
    python examples/digits.py --strategy=parameter_server  # the same, in-process cluster
    python examples/digits.py --strategy=parameter_server --input_service=chief
        # the workers read their batches from a tf.data service in the chief
    python -m tfdist.launch --workers 2:3 --restarts 3 -- python -u examples/digits.py \
        --strategy=multi_worker --elastic --model_dir=/tmp/digits
        # SIGTERM to any task: every task saves at one step and exits 143; the job goes
        # on from that step (on 2 workers if one is lost); run again to resume

Prints Keras's progress bar, then per-epoch test accuracy and examples/s
(with --strategy=layer_placement also the placement report, with
--strategy=mesh the layout report).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Sequence

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
from tensorflow import keras  # Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1.

import tfdist

_STRATEGY = flags.DEFINE_enum(
    "strategy", "mirrored",
    ["mirrored", "multi_worker", "parameter_server", "layer_placement", "mesh",
     "tf_mirrored", "single"],
    "mirrored: tfdist.MirroredStrategy; multi_worker: "
    "tfdist.MultiWorkerMirroredStrategy over the TF_CONFIG cluster; "
    "parameter_server: tfdist.ParameterServerStrategy (asynchronous) over "
    "the TF_CONFIG cluster (chief, workers, ps), or without TF_CONFIG an "
    "in-process cluster of 2 workers and 2 ps; "
    "layer_placement: tfdist.LayerPlacementStrategy (the layers in stages "
    "over the devices, --num_microbatches per step); "
    "mesh: tfdist.MeshStrategy (Keras 3; --mesh rows split each batch, columns "
    "split the hidden layers' weights, Megatron's column-then-row pairs); "
    "tf_mirrored: tf.distribute's built-in MirroredStrategy; single: one "
    "device, no strategy.")
_SIMULATE_CPU_DEVICES = flags.DEFINE_integer(
    "simulate_cpu_devices", 4,
    "Split the CPU into this many logical devices (0: use real devices).",
    lower_bound=0)
_ALL_REDUCE = flags.DEFINE_enum(
    "all_reduce", "auto", ["auto", "ring", "tree", "reduce_to_one"],
    "tfdist all-reduce algorithm (--strategy=mirrored).")
_COMPRESSION = flags.DEFINE_enum(
    "compression", None, ["fp16", "bf16"],
    "Gradient wire format of tfdist strategies (default: float32).")
_NUM_MICROBATCHES = flags.DEFINE_integer(
    "num_microbatches", 4,
    "Microbatches per step, M (--strategy=layer_placement): the stages idle "
    "(S - 1) / (M + S - 1) of each step.", lower_bound=1)
_DATA_PARALLEL = flags.DEFINE_integer(
    "data_parallel", 1,
    "Copies of the pipeline each batch is split over (--strategy=layer_placement; "
    "pipeline x data): the devices form this many equal groups.", lower_bound=1)
_MESH = flags.DEFINE_string(
    "mesh", "2x2",
    "BATCHxMODEL devices of the mesh (--strategy=mesh): BATCH rows each take a "
    "slice of every batch, MODEL columns each hold a slice of every hidden "
    "layer; BATCH * MODEL must be the number of devices.")
_MODEL = flags.DEFINE_enum(
    "model", "mlp", ["mlp", "deep_mlp"],
    "mlp: Dense 128-64; deep_mlp: 8 x Dense(512), enough work per layer "
    "for --strategy=layer_placement to gain.")
_GLOBAL_BATCH_SIZE = flags.DEFINE_integer(
    "global_batch_size", 64, "Batch size summed over all replicas.", lower_bound=1)
_EPOCHS = flags.DEFINE_integer("epochs", 8, "Training epochs.", lower_bound=1)
_STEPS = flags.DEFINE_integer(
    "steps", None, "If set, stop each epoch after this many steps (smoke runs).",
    lower_bound=1)
_LEARNING_RATE = flags.DEFINE_float(
    "learning_rate", 3e-3, "Adam learning rate.", lower_bound=0.0)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None,
    "If set: BackupAndRestore state and the final weights are written here.")
_ELASTIC = flags.DEFINE_bool(
    "elastic", False,
    "With --model_dir: tfdist.elastic.Elastic instead of BackupAndRestore (on SIGTERM save at a "
    "step, resume at that step on any number of workers); the data is not reshuffled per epoch.")
_INPUT_SERVICE = flags.DEFINE_string(
    "input_service", None,
    "With --strategy=parameter_server: unset (the chief reads the data and sends each batch "
    "with its step), 'chief' (a tf.data service in the chief's process) or 'grpc://host:port' "
    "(your tf.data service's dispatcher): the workers read their batches from it.")
_SEED = flags.DEFINE_integer(
    "seed", None, "If set: the initial weights' seed (keras.utils.set_random_seed), so that runs "
    "can be compared (a resumed --elastic run with an uninterrupted one).")
_DATA_PATH = flags.DEFINE_string(
    "data_path", None,
    "An .npz file with arrays `x` (N, features) and `y` (N,) integer labels; "
    "default: scikit-learn's bundled digits (no download).")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    strategy: str = "mirrored"
    simulate_cpu_devices: int = 4
    all_reduce: str = "auto"
    compression: str | None = None
    num_microbatches: int = 4
    data_parallel: int = 1
    mesh: str = "2x2"
    model: str = "mlp"
    global_batch_size: int = 64
    epochs: int = 8
    steps: int | None = None
    learning_rate: float = 3e-3
    model_dir: str | None = None
    elastic: bool = False
    seed: int | None = None
    data_path: str | None = None
    input_service: str | None = None


@dataclasses.dataclass(frozen=True)
class TrainResult:
    test_accuracy: float
    examples_per_second: float
    num_replicas: int


def load_data(data_path: str | None):
    """(x_train, y_train), (x_test, y_test): digits, or the user's .npz."""
    if data_path:
        with np.load(data_path) as data:
            x, y = data["x"].astype("float32"), data["y"].astype("int32")
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = digits.data.astype("float32") / 16.0, digits.target.astype("int32")
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
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


def build_model(num_features: int, num_classes: int, learning_rate: float,
                kind: str = "mlp"):
    widths = [128, 64] if kind == "mlp" else [512] * 8
    model = keras.Sequential(
        [keras.Input((num_features,))]
        + [keras.layers.Dense(width, activation="relu", name=f"dense_hidden_{i}")
           for i, width in enumerate(widths)]
        + [keras.layers.Dense(num_classes, name="dense_logits")])
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    return model


def make_strategy(config: TrainConfig):
    if config.strategy == "single":
        return tf.distribute.get_strategy()
    if config.strategy == "tf_mirrored":
        return tf.distribute.MirroredStrategy()
    if config.strategy == "multi_worker":
        if tfdist.cluster.parse_tf_config().is_local:
            print("No TF_CONFIG cluster: training as a 1-worker cluster. For a "
                  "2-worker cluster on this machine run:\n  python -m "
                  "tfdist.launch --workers 2 -- python examples/digits.py "
                  "--strategy=multi_worker", flush=True)
        # tfdist: workers from TF_CONFIG.
        return tfdist.MultiWorkerMirroredStrategy(compression=config.compression)
    if config.strategy == "parameter_server":
        cluster = None  # tfdist: chief, workers and ps from TF_CONFIG.
        if tfdist.cluster.parse_tf_config().is_local:
            # The script restarts here, in a private network (the servers'
            # ports unreachable from outside), and prints what follows once.
            cluster = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
            print("No TF_CONFIG cluster: training on an in-process cluster of "
                  "2 workers and 2 ps. For separate processes run:\n  python "
                  "-m tfdist.launch --chief --workers 2 --ps 2 -- python -u "
                  "examples/digits.py --strategy=parameter_server", flush=True)
        # tfdist: on worker and ps tasks this serves and never returns.
        return tfdist.ParameterServerStrategy(cluster, input_service=config.input_service)
    if config.strategy == "layer_placement":
        # tfdist: the layers in stages over all local devices (data_parallel
        # copies of the pipeline), M microbatches a step per copy.
        return tfdist.LayerPlacementStrategy(
            num_microbatches=config.num_microbatches, data_parallel=config.data_parallel)
    if config.strategy == "mesh":
        rows, columns = (int(n) for n in config.mesh.lower().split("x"))
        # tfdist: hidden layers in Megatron's pairs: an even one's output columns
        # split over the mesh's "model" axis, the next one's input rows.
        layout_map = {
            r".*dense_hidden_\d*[02468]/kernel": (None, "model"),
            r".*dense_hidden_\d*[02468]/bias": ("model",),
            r".*dense_hidden_\d*[13579]/kernel": ("model", None),
        }
        return tfdist.MeshStrategy({"batch": rows, "model": columns}, layout_map=layout_map)
    # tfdist: all local devices.
    return tfdist.MirroredStrategy(all_reduce=config.all_reduce, compression=config.compression)


def train(config: TrainConfig) -> TrainResult:
    if config.simulate_cpu_devices and config.strategy not in (
            "multi_worker", "parameter_server"):
        tfdist.simulate_cpu_devices(config.simulate_cpu_devices)  # tfdist: N logical CPUs.

    (x_train, y_train), (x_test, y_test) = load_data(config.data_path)
    if config.seed is not None:
        keras.utils.set_random_seed(config.seed)
    strategy = make_strategy(config)
    print(f"strategy={config.strategy} replicas={strategy.num_replicas_in_sync} "
          f"global_batch_size={config.global_batch_size}", flush=True)
    # tfdist: variables created here are distributed (on the ps tasks with
    # --strategy=parameter_server).
    with strategy.scope():
        model = build_model(x_train.shape[1], int(y_train.max()) + 1,
                            config.learning_rate, config.model)
    throughput = Throughput(config.global_batch_size)
    callbacks: list[keras.callbacks.Callback] = [throughput]
    if config.model_dir and config.elastic:
        # tfdist: on SIGTERM save at a step; resume at that step.
        callbacks.append(tfdist.elastic.Elastic(f"{config.model_dir}/backup"))
    elif config.model_dir:
        callbacks.append(keras.callbacks.BackupAndRestore(f"{config.model_dir}/backup"))
    model.fit(x_train, y_train, batch_size=config.global_batch_size,
              epochs=config.epochs, steps_per_epoch=config.steps,
              # --elastic: one fixed order (load_data's), so a resumed epoch goes on
              # with the examples it had left; with a global batch the replicas
              # divide, tfdist.data.ShardOptions(seed=0) reshuffles reproducibly.
              shuffle=not config.elastic,
              validation_data=(x_test, y_test), callbacks=callbacks, verbose=2)
    _, accuracy = model.evaluate(x_test, y_test, batch_size=config.global_batch_size,
                                 verbose=0)
    if config.model_dir and strategy.extended.should_checkpoint:  # tfdist: chief keeps it.
        path = f"{config.model_dir}/digits.weights.h5"
        model.save_weights(path)
        print(f"saved weights to {path}", flush=True)
    elif config.model_dir:  # tfdist: other workers save too (tf-keras's save runs collectives).
        with tempfile.TemporaryDirectory() as scratch:
            model.save_weights(os.path.join(scratch, "digits.weights.h5"))
    if config.strategy == "layer_placement":  # tfdist: where each layer ran.
        print(strategy.placement_report(), flush=True)
    if config.strategy == "mesh":  # tfdist: how each variable is split.
        print(strategy.layout_report(), flush=True)
    steady = throughput.rates[1:] or throughput.rates  # Epoch 1 includes tracing.
    result = TrainResult(float(accuracy), float(np.median(steady)),
                         strategy.num_replicas_in_sync)
    print(f"test_accuracy={result.test_accuracy:.4f} "
          f"examples_per_second={result.examples_per_second:,.0f} "
          f"replicas={result.num_replicas}", flush=True)
    return result


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _ELASTIC.value and not _MODEL_DIR.value:
        raise app.UsageError("--elastic saves in --model_dir: pass e.g. --model_dir=/tmp/digits.")
    train(TrainConfig(
        strategy=_STRATEGY.value,
        simulate_cpu_devices=_SIMULATE_CPU_DEVICES.value,
        all_reduce=_ALL_REDUCE.value,
        compression=_COMPRESSION.value,
        num_microbatches=_NUM_MICROBATCHES.value,
        data_parallel=_DATA_PARALLEL.value,
        mesh=_MESH.value,
        model=_MODEL.value,
        global_batch_size=_GLOBAL_BATCH_SIZE.value,
        epochs=_EPOCHS.value,
        steps=_STEPS.value,
        learning_rate=_LEARNING_RATE.value,
        model_dir=_MODEL_DIR.value,
        elastic=_ELASTIC.value,
        seed=_SEED.value,
        data_path=_DATA_PATH.value,
        input_service=_INPUT_SERVICE.value,
    ))


if __name__ == "__main__":
    app.run(main)
