"""Tutorial "Custom training loop with Keras and MultiWorkerMirroredStrategy", ported.

Source: tensorflow/docs site/en/tutorials/distribute/multi_worker_with_ctl.ipynb
(TF 2.21). Kept as written: `mnist.dataset_fn` (an unseeded `shuffle(60000)`
of the whole dataset, then `shard(num_input_pipelines, input_pipeline_id)`,
then `batch(per_replica_batch_size)`), `build_cnn_model` with its L2
regularizers, RMSprop, the `train_step(iterator)` tf.function with
`strategy.run` and `strategy.reduce`, `compute_average_loss` and
`scale_regularization_loss`, the epoch/step variables and the
`CheckpointManager` with the chief-or-temporary-directory `write_filepath`
of main.py, on 2 worker processes on 127.0.0.1. Changed: bundled digits
instead of MNIST (with the id channel and `ExampleCounter` in front of the
model), 512 examples and 4 steps per epoch (one pass over each worker's
shard), 2 epochs, results returned instead of printed.

The tutorial's pipeline shuffles every worker's copy of the whole dataset
differently and then keeps one shard of it, so with TF's strategy the
workers' shards overlap. tfdist gives that shuffle a seed every worker
shares (`tfdist/data/distributed/distribute.py`), so the shards partition the data.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tests.conformance import harness

pytestmark = [pytest.mark.model, pytest.mark.multiprocess]

NUM_TRAIN = 512
PER_WORKER_BATCH_SIZE = 64
GLOBAL_BATCH_SIZE = PER_WORKER_BATCH_SIZE * harness.NUM_WORKERS
NUM_STEPS_PER_EPOCH = NUM_TRAIN // GLOBAL_BATCH_SIZE
NUM_EPOCHS = 2


def mnist_dataset(batch_size):
    (x_train, y_train), _ = harness.load_mnist_like(num_train=NUM_TRAIN)
    # The `x` arrays are in uint8 and have values in the range [0, 255].
    # You need to convert them to float32 with values in the range [0, 1]
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(60000)
    return train_dataset


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset(batch_size)
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset


def build_cnn_model(counter):
    regularizer = tf.keras.regularizers.L2(1e-5)
    return tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28, 2)),
        counter,
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3,
                               activation='relu',
                               kernel_regularizer=regularizer),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128,
                              activation='relu',
                              kernel_regularizer=regularizer),
        tf.keras.layers.Dense(10, kernel_regularizer=regularizer)
    ])


def _is_chief(task_type, task_id, cluster_spec):
    return (task_type is None
            or task_type == 'chief'
            or (task_type == 'worker'
                and task_id == 0
                and 'chief' not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath, task_id):
    base_dirpath = 'workertemp_' + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def main(contender: str, workdir: str) -> harness.Record:
    """The tutorial's main.py, for one worker of `contender`."""
    checkpoint_dir = os.path.join(workdir, 'ckpt')
    strategy = harness.make_strategy(contender)
    with strategy.scope():
        # Model building/compiling need to be within `tf.distribute.Strategy.scope`.
        counter = harness.ExampleCounter(1797, id_scale=1 / 255)
        multi_worker_model = build_cnn_model(counter)
        multi_worker_dataset = strategy.distribute_datasets_from_function(
            lambda input_context: dataset_fn(GLOBAL_BATCH_SIZE, input_context))
        optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(
            name='train_accuracy')

    @tf.function
    def train_step(iterator):
        """Training step function."""

        def step_fn(inputs):
            """Per-Replica step function."""
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True,
                    reduction=tf.keras.losses.Reduction.NONE)(y, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss)
                model_losses = multi_worker_model.losses
                if model_losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            optimizer.apply_gradients(
                zip(grads, multi_worker_model.trainable_variables))
            train_accuracy.update_state(y, predictions)
            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    epoch = tf.Variable(
        initial_value=tf.constant(0, dtype=tf.dtypes.int64), name='epoch')
    step_in_epoch = tf.Variable(
        initial_value=tf.constant(0, dtype=tf.dtypes.int64),
        name='step_in_epoch')
    task_type, task_id = (strategy.cluster_resolver.task_type,
                          strategy.cluster_resolver.task_id)
    cluster_spec = strategy.cluster_resolver.cluster_spec()

    checkpoint = tf.train.Checkpoint(
        model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)

    write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id,
                                          cluster_spec)
    checkpoint_manager = tf.train.CheckpointManager(
        checkpoint, directory=write_checkpoint_dir, max_to_keep=1)

    latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
    if latest_checkpoint:
        checkpoint.restore(latest_checkpoint)

    per_epoch_counts = []
    losses = []
    while epoch.numpy() < NUM_EPOCHS:
        before = counter.local_counts(strategy)["train"]
        iterator = iter(multi_worker_dataset)
        total_loss = 0.0
        num_batches = 0

        while step_in_epoch.numpy() < NUM_STEPS_PER_EPOCH:
            total_loss += train_step(iterator)
            num_batches += 1
            step_in_epoch.assign_add(1)

        train_loss = total_loss / num_batches
        losses.append(float(train_loss))
        per_epoch_counts.append(counter.local_counts(strategy)["train"] - before)
        train_accuracy.reset_state()

        checkpoint_manager.save()
        if not _is_chief(task_type, task_id, cluster_spec):
            tf.io.gfile.rmtree(write_checkpoint_dir)

        epoch.assign_add(1)
        step_in_epoch.assign(0)

    return harness.Record(
        train_counts=per_epoch_counts,
        weights=multi_worker_model.get_weights(),
        values={"loss": losses},
    )


def worker(contender: str, workdir: str) -> harness.Record:
    """One task of the cluster (run by `harness.run_on_cluster`)."""
    return harness.recorded(main, contender, workdir)


class MultiWorkerCustomLoopTutorialTest(harness.ConformanceTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tfdist = harness.run_on_cluster(
            worker, "tfdist_multi_worker", tempfile.mkdtemp(prefix="ctl_tfdist_"))
        cls.tf = harness.run_on_cluster(
            worker, "tf_multi_worker", tempfile.mkdtemp(prefix="ctl_tf_")
        ) if harness.TF_CONTENDER else None

    def test_tfdist_workers_see_every_example_once_per_epoch(self):
        self.assert_workers_saw_each_example_once_per_epoch(self.tfdist, NUM_TRAIN, NUM_EPOCHS)
        self.assert_workers_agree(self.tfdist)

    @harness.needs_tf_contender
    def test_tf_strategy_workers_overlap_and_miss_examples(self):
        for record in self.tf:
            self.assert_ran(record)
        first_epoch = sum(r.train_counts[0] for r in self.tf)[:NUM_TRAIN]
        self.assertFalse(np.all(first_epoch == 1), "TF's workers' shards partitioned the data")


if __name__ == "__main__":
    tfdist.testing.main()
