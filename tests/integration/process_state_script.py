"""Child of process_state_test.py: what tfdist leaves of TF and Keras, and plain Keras after it.

    python process_state_script.py MODE OUT_JSON WORKDIR

MODE "tfdist": snapshot the attributes of the TF and Keras classes and
modules tfdist touches (or might), then train under each tfdist strategy
that runs in one process (Mirrored, LayerPlacement, MultiWorkerMirrored on
one worker, ParameterServer with split variables on an in-process
cluster, each through `fit`, a `GradientTape` step in `strategy.run` and
weight files), comparing the snapshot after each `fit` and after the
strategies are dropped; then the plain run. MODE "plain": the plain run
only, with tfdist never imported. The plain run is a second model, as a
user writes it after the distributed one: `fit` with a `ModelCheckpoint`
and `BackupAndRestore`, a `GradientTape` step, weight files written and
read back. It writes {"changed": [...], "plain": {...}} to OUT_JSON.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

NUM_DEVICES = 4
VOCABULARY = 1000
EMBEDDING_DIM = 16
KERAS_3 = os.environ.get("TF_USE_LEGACY_KERAS") not in ("1", "true", "True")

#: Module -> names in it whose attributes are snapshotted (None: the module's own).
WATCHED = {
    "tensorflow": ["GradientTape", "Variable"],
    "tensorflow.python.eager.polymorphic_function.atomic_function": ["InterpolateRuntimeError"],
    "tensorflow.python.distribute.mirrored_strategy": ["MirroredStrategy", "MirroredExtended"],
    "tensorflow.python.distribute.collective_all_reduce_strategy": [
        "CollectiveAllReduceStrategy", "CollectiveAllReduceExtended"],
    "tensorflow.python.distribute.parameter_server_strategy_v2": [
        "ParameterServerStrategyV2", "ParameterServerStrategyV2Extended"],
    "tensorflow.python.distribute.sharded_variable": ["ShardedVariable"],
    "tensorflow.python.distribute.values": ["PerReplica", "MirroredVariable"],
    "tensorflow.python.data.ops.multi_device_iterator_ops": [None],
    "tensorflow.python.distribute.cross_device_ops": [None],
}
if KERAS_3:
    WATCHED.update({
        "keras.src.backend.tensorflow.numpy": [None],
        "keras.src.backend.tensorflow.trainer": ["TensorFlowTrainer"],
        "keras.src.backend.tensorflow.core": ["Variable"],
        "keras.src.layers.layer": ["Layer"],
        "keras.src.models.model": ["Model"],
        "keras.src.callbacks.backup_and_restore": ["BackupAndRestore"],
        "keras.src.callbacks.model_checkpoint": ["ModelCheckpoint"],
        "keras.src.optimizers.base_optimizer": ["BaseOptimizer"],
    })
else:
    WATCHED.update({
        "tf_keras.src.engine.base_layer": ["Layer"],
        "tf_keras.src.engine.training": ["Model"],
        "tf_keras.src.saving.legacy.hdf5_format": [None],
        "tf_keras.src.mixed_precision.loss_scale_optimizer": [None],
        "tf_keras.src.callbacks": ["BackupAndRestore", "ModelCheckpoint"],
        "tf_keras.src.optimizers.optimizer": ["Optimizer"],
    })


def snapshot() -> dict[str, int]:
    """`module.name.attribute` -> id of the object stored there, for every watched owner."""
    found = {}
    for module_name, names in WATCHED.items():
        module = importlib.import_module(module_name)
        for name in names:
            owner = module if name is None else getattr(module, name)
            label = module_name if name is None else f"{module_name}.{name}"
            for attribute, value in vars(owner).items():
                found[f"{label}.{attribute}"] = id(value)
    return found


def changed(before: dict[str, int], when: str) -> list[str]:
    after = snapshot()
    return [
        f"{when}: {key} {'added' if key not in before else 'removed' if key not in after else 'replaced'}"
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    ]


def data():
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCABULARY, size=(64, 3)).astype("int32")
    y = rng.integers(0, 3, size=(64,)).astype("int32")
    return x, y


def build(strategy=None):
    keras = tf.keras
    keras.utils.set_random_seed(7)
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        model = keras.Sequential([
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(VOCABULARY, EMBEDDING_DIM),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ])
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


def dense(value) -> np.ndarray:
    return np.asarray(tf.convert_to_tensor(value))


def tape_step(model, x, y, strategy=None):
    """A custom loop's gradients of the model's loss, in `strategy.run` when given."""
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none" if KERAS_3 else tf.keras.losses.Reduction.NONE)

    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
        return tape.gradient(loss, model.trainable_variables)

    if strategy is None:
        return [dense(g) for g in gradients(x, y)]
    return strategy.run(tf.function(gradients), args=(x, y))


def weight_files(model, directory: str) -> None:
    """Weights saved in each format of the front end, and read back."""
    model.save_weights(os.path.join(directory, "w.weights.h5"))
    if KERAS_3:
        model.load_weights(os.path.join(directory, "w.weights.h5"))
    else:
        # tf-keras 2.21 fails to read a `.weights.h5` back into a model with
        # sync-on-read variables under TF's MirroredStrategy too (an h5py
        # Dataset divided by the replica count): its legacy `.h5` instead.
        model.save_weights(os.path.join(directory, "w.h5"))
        model.load_weights(os.path.join(directory, "w.h5"))


def plain_run(directory: str) -> dict[str, object]:
    """A second model, as in a script with no tfdist: fit with checkpoints, a tape step, weight files."""
    keras = tf.keras
    x, y = data()
    model = build()
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(
            os.path.join(directory, "ckpt.weights.h5"), save_weights_only=True),
        keras.callbacks.BackupAndRestore(os.path.join(directory, "backup")),
    ])
    gradients = tape_step(model, x[:16], y[:16])
    files = sorted(os.listdir(directory))
    weight_files(model, directory)
    reloaded = build()
    reloaded.load_weights(os.path.join(directory, "w.weights.h5"))
    return {
        "loss": history.history["loss"],
        "weights": [w.tolist() for w in model.get_weights()],
        "gradients": [g.tolist() for g in gradients],
        "files": files,
        "reloaded": [w.tolist() for w in reloaded.get_weights()],
    }


def tfdist_runs(workdir: str) -> list[str]:
    """Every in-process tfdist strategy through fit, a tape step and weight files; what changed."""
    import tfdist

    # First: the program restarts here in a private network namespace (as
    # start_local_ps_cluster's contract asks), then starts the servers; the
    # chief joins them last.
    ps_cluster = tfdist.testing.start_local_ps_cluster(num_workers=1, num_ps=2)
    before = snapshot()
    found: list[str] = []
    x, y = data()
    devices = [f"/cpu:{i}" for i in range(NUM_DEVICES)]
    strategies = {  # Made in turn; the parameter-server strategy last (it joins this process).
        "mirrored": lambda: tfdist.MirroredStrategy(devices),
        "layer_placement": lambda: tfdist.LayerPlacementStrategy(devices[:2]),
        "multi_worker": lambda: tfdist.MultiWorkerMirroredStrategy(),
        "parameter_server": lambda: tfdist.ParameterServerStrategy(
            ps_cluster, mode="sync",
            variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=VOCABULARY * EMBEDDING_DIM, max_shards=2)),
    }
    kept = []
    for name, make in strategies.items():
        strategy = make()
        kept.append(strategy)
        model = build(strategy)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        found += changed(before, f"after {name} fit")
        if name != "parameter_server":  # TF's coordinator schedules a PS strategy's steps.
            tape_step(model, x[:16], y[:16], strategy)
            found += changed(before, f"after {name} strategy.run")
        directory = os.path.join(workdir, name)
        os.makedirs(directory)
        weight_files(model, directory)
        model.get_weights()
        found += changed(before, f"after {name} weight files")
        if name == "parameter_server":
            shards = strategy.variable_shards(model.layers[0].embeddings)
            if len(shards) != 2:
                found.append(f"the embedding was not split: {len(shards)} shard(s)")
    del kept, strategy, model
    gc.collect()
    found += changed(before, "after the strategies were dropped")
    return found


def main(mode: str, out_path: str, workdir: str) -> None:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES,
    )
    found = tfdist_runs(workdir) if mode == "tfdist" else []
    plain_dir = os.path.join(workdir, "plain")
    os.makedirs(plain_dir)
    result = {"changed": found, "plain": plain_run(plain_dir)}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
