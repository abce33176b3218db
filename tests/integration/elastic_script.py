"""The program of the elastic tests (run as a script, one per task, or alone).

    python elastic_script.py MODE OUT_DIR

Trains a small classifier whose first layer counts, in a weight summed
over all replicas, how often it trained on each example (ids in feature
column 0). Saved and restored with the model, the final model's counts say
which examples were trained on, how often, across every attempt. Under TF_CONFIG
the strategy is `tfdist.MultiWorkerMirroredStrategy`, else
`tfdist.MirroredStrategy` on this process's CPUs. Epochs of STEPS_PER_EPOCH
steps, a short last batch included; the input is not shuffled unless MODE
says so. The chief writes the final weights to OUT_DIR/weights.npz.

MODE:

- `reference`: no callback.
- `self_sigterm`: `tfdist.elastic.Elastic(OUT_DIR/backup)`; on its first
  attempt (no OUT_DIR/attempted-<task> yet) the last task sends itself
  SIGTERM after step SIGNAL_STEP of epoch SIGNAL_EPOCH.
- `wait_for_sigterm`: Elastic; on the first attempt every task writes
  OUT_DIR/reached-<task> after step SIGNAL_STEP of epoch SIGNAL_EPOCH and
  then trains slowly (0.2 s a step) until it is stopped from outside.
- `kill`: `Elastic(OUT_DIR/backup, save_freq=COMMIT_STEPS)`; on its first
  attempt the last task kills itself (SIGKILL) after step SIGNAL_STEP of
  epoch SIGNAL_EPOCH, past its last commit, KILL_DELAY_S after that step
  ended (its peers have ended it too by then: they wait for it in the
  next step). `kill_keep_nothing`: the same with `save_on_loss=False`.
- a `_shard` suffix: tfdist shuffles per epoch (`ShardOptions`).
- a `_mesh` suffix (TF_CONFIG with 2 workers): `tfdist.MeshStrategy({"batch": 2,
  "model": 2})` on 2 logical CPUs per worker (automatic layouts: the hidden
  Dense layer split over a worker's two).
- a `_ps` suffix (TF_CONFIG with a chief, 1 worker and 1 ps task):
  `tfdist.ParameterServerStrategy()` in async mode, its steps queued on
  the one worker (each runs after the one before, as on one device, while
  the chief's loop runs ahead of them); the chief is the task that signals
  itself or marks the point; every task writes its pid to
  OUT_DIR/pid-<type>-<index> first. `_ps_sync`: the same in sync mode (each batch
  split over the workers, however many: one device's update).

A task stopped by a notice writes OUT_DIR/preempted-<task>.json: the epoch
and step it saved at.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import tfdist
from tfdist.elastic import last_step

# Every step end is kept (not 1% of the time): the kill test checks the step its survivor saved.
last_step.COST_SHARE = 1.0

keras = tf.keras
TF_KERAS = os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")  # TF's rule.
NUM_EXAMPLES = 120
GLOBAL_BATCH_SIZE = 16
STEPS_PER_EPOCH = 8  # 7 full steps and one of 8 examples.
EPOCHS = 3
SIGNAL_EPOCH = 1
SIGNAL_STEP = 2  # 0-based batch index.
COMMIT_STEPS = 2
KILL_DELAY_S = 1.0
NUM_FEATURES = 5


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_EXAMPLES, NUM_FEATURES)).astype("float32")
    x[:, 0] = np.arange(NUM_EXAMPLES)
    y = (x[:, 1] - x[:, 2] > 0).astype("int32")
    return x, y


class CountIds(keras.layers.Layer):
    """Counts the ids (column 0) it trains on, over all replicas, in the weight `counts`.

    A weight: saved and restored with the model, so the final model's counts
    cover every attempt, and a step trained again after a restore counts once.
    """

    def build(self, input_shape):
        # Every replica adds the same all-reduced count, applied once; Keras
        # 3's aggregation="sum" would add it once per replica. A sync
        # parameter-server step's slices (one replica each, concurrent) each
        # add their own: `assign_add` is atomic on the ps task.
        aggregation = tf.VariableAggregation.ONLY_FIRST_REPLICA if TF_KERAS else "only_first_replica"
        self.counts = self.add_weight(
            name="counts", shape=(NUM_EXAMPLES,), initializer="zeros", trainable=False,
            aggregation=aggregation,
        )

    def call(self, inputs, training=None):
        if training:
            ids = tf.cast(inputs[:, 0], tf.int32)
            # A one-hot sum, not bincount: DTensor (MeshStrategy) has no rule for bincount.
            seen = tf.reduce_sum(tf.one_hot(ids, NUM_EXAMPLES), axis=0)
            context = tf.distribute.get_replica_context()
            if context is not None and context.num_replicas_in_sync > 1:
                seen = context.all_reduce("sum", seen)
            self.counts.assign_add(seen)
        return inputs[:, 1:]


def build_model(adam: bool = False, dropout: bool = False):
    """The counting classifier; SGD with momentum or Adam; with a Dropout layer or not.

    Adam's update depends on the optimizer's step count and Dropout on its
    seed's state: both must cross a resumption as they were.
    """
    keras.utils.set_random_seed(1)
    dropout = [keras.layers.Dropout(0.25)] if dropout else []
    model = keras.Sequential([
        keras.Input((NUM_FEATURES,)),
        CountIds(),
        keras.layers.Dense(8, activation="relu"),
        *dropout,
        keras.layers.Dense(2),
    ])
    optimizer = keras.optimizers.Adam(0.01) if adam else keras.optimizers.SGD(0.05, momentum=0.9)
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _Signal(keras.callbacks.Callback):
    """At (SIGNAL_EPOCH, SIGNAL_STEP): SIGTERM or SIGKILL to this process, or marks the point and slows down."""

    def __init__(self, out_dir: str, task: str, mode: str) -> None:
        super().__init__()
        self._out_dir, self._task, self._mode = out_dir, task, mode
        self._epoch = 0
        self._reached = False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._reached:
            time.sleep(0.2)
        elif self._epoch == SIGNAL_EPOCH and batch == SIGNAL_STEP:
            self._reached = True
            if self._mode == "wait_for_sigterm":
                open(os.path.join(self._out_dir, f"reached-{self._task}"), "w").close()
            elif self._mode == "kill":
                time.sleep(KILL_DELAY_S)
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                os.kill(os.getpid(), signal.SIGTERM)


def main(mode: str, out_dir: str) -> None:
    shard = mode.endswith("_shard")
    mode = mode.removesuffix("_shard")
    on_mesh = mode.endswith("_mesh")
    mode = mode.removesuffix("_mesh")
    ps_mode = "sync" if mode.endswith("_ps_sync") else "async"
    mode = mode.removesuffix("_sync")
    on_ps = mode.endswith("_ps")
    mode = mode.removesuffix("_ps")
    save_on_loss = not mode.endswith("_keep_nothing")
    mode = mode.removesuffix("_keep_nothing")
    options = tfdist.data.ShardOptions(seed=7, shuffle=True) if shard else None
    if on_ps:
        # The test signals a serving task by this pid (its strategy never returns).
        this = json.loads(os.environ["TF_CONFIG"])["task"]
        with open(os.path.join(out_dir, f"pid-{this['type']}-{this['index']}"), "w") as f:
            f.write(str(os.getpid()))
        strategy = tfdist.ParameterServerStrategy(mode=ps_mode, timeout_s=30)  # Serves on worker and ps tasks.
        task, tasks = "chief", ["chief"]
    elif on_mesh:
        tfdist.simulate_cpu_devices(2)
        strategy = tfdist.MeshStrategy({"batch": 2, "model": 2}, layout_map=None, timeout_s=30)
        task = strategy.cluster_config.task.name
        tasks = [t.name for t in strategy.cluster_config.cluster.tasks()]
    elif "TF_CONFIG" in os.environ:
        strategy = tfdist.MultiWorkerMirroredStrategy(timeout_s=30, shard_options=options)
        task = strategy.cluster_config.task.name
        tasks = [t.name for t in strategy.cluster_config.cluster.tasks()]
    else:
        strategy = tfdist.MirroredStrategy(shard_options=options)
        task, tasks = "worker:0", ["worker:0"]
    attempted = os.path.join(out_dir, f"attempted-{task.replace(':', '-')}")
    first_attempt = not os.path.exists(attempted)
    open(attempted, "a").close()
    callbacks = []
    if mode != "reference":
        save_freq = COMMIT_STEPS if mode == "kill" else None
        callbacks.append(tfdist.elastic.Elastic(
            os.path.join(out_dir, "backup"), save_freq=save_freq, save_on_loss=save_on_loss))
        if first_attempt and (mode == "wait_for_sigterm" or task == tasks[-1]):
            callbacks.append(_Signal(out_dir, task, mode))
    with strategy.scope():
        model = build_model()
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
    try:
        model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=callbacks)
    except tfdist.errors.TrainingPreempted as e:
        with open(os.path.join(out_dir, f"preempted-{task.replace(':', '-')}.json"), "w") as f:
            json.dump({"epoch": e.epoch, "step": e.step}, f)
        raise
    if strategy.extended.should_checkpoint:
        np.savez(os.path.join(out_dir, "weights.npz"), *model.get_weights())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
