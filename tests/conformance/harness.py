"""What every conformance test shares: contenders, bundled data, example counting.

A conformance test ports a TensorFlow or Keras distributed-training tutorial
faithfully (its pipeline, model, loop, callbacks and batch sizes) and runs it
once per contender, in one process, each from the same seed:

- `one_device`: TF's `OneDeviceStrategy` on one CPU, the reference;
- `tf`: TF's own strategy (`tf.distribute.MirroredStrategy` on the same
  logical CPUs);
- `tfdist`: tfdist's strategy.

Each run returns a `Record`; tests assert that tfdist saw every example
exactly once per epoch and gave one device's results, and record what TF's
strategy does (where it fails a pattern, the test asserts that and that
tfdist does not).

Data: scikit-learn's bundled digits (1,797 8x8 images), upscaled to
MNIST's 28x28 uint8-range images, as `load_mnist_like()`; no download.

Counting examples without changing a tutorial's loop: every image gets a
second channel holding its example id, and `ExampleCounter`, placed before
the tutorial's first layer, strips that channel and counts the ids it sees
(training and inference apart) in sync-on-read variables. The tutorial's
model is otherwise unchanged (its first layer sees one channel).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import tfdist

keras = tf.keras

#: Whether tf.keras is Keras 3 (else tf-keras, TF_USE_LEGACY_KERAS=1).
KERAS_3 = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() not in ("1", "true")
NUM_REPLICAS = 4
DEVICES = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]
SEED = 7
CONTENDERS = ("one_device", "tf", "tfdist")

#: Same examples, same order, same initial weights: the runs differ in how
#: float32 sums are grouped (per replica, then across replicas). Over a few
#: Adam steps on a small conv net that stays within these.
RTOL = 1e-4
ATOL = 1e-5


#: Workers of the multi-worker ports, and their bound (start-up included).
NUM_WORKERS = 2
CLUSTER_TIMEOUT_S = 180


def make_strategy(contender: str) -> tf.distribute.Strategy:
    """The contender's strategy, built as its tutorial builds TF's."""
    if contender == "one_device":
        # A strategy, not none: Keras 3 then starts the same extra iterator
        # to build the model as with the others, so a reshuffling pipeline
        # gives every contender the same epochs.
        return tf.distribute.OneDeviceStrategy(DEVICES[0])
    if contender == "tf":
        return tf.distribute.MirroredStrategy(DEVICES)
    if contender == "tfdist":
        return tfdist.MirroredStrategy(DEVICES)
    if contender == "tfdist_layer_placement":
        # Stages over the same logical CPUs, 4 microbatches a step.
        return tfdist.LayerPlacementStrategy(DEVICES, num_microbatches=NUM_REPLICAS)
    if contender == "tf_multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if contender == "tfdist_multi_worker":
        # TF's keywords, as a script written for TF's strategy passes them.
        return tfdist.MultiWorkerMirroredStrategy(
            cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver(),
            communication_options=tf.distribute.experimental.CommunicationOptions(
                timeout_seconds=60),
        )
    raise ValueError(f"unknown contender {contender!r}")


def load_mnist_like(
    num_train: int = 1440,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train_images, train_labels), (test_images, test_labels), MNIST-shaped.

    Images are float32 in [0, 255] with shape (n, 28, 28, 2): channel 0 the
    digit, channel 1 the example's id (train: 0..n-1, test: continuing), so
    `ExampleCounter` can count them. Labels are uint8 in 0..9.
    """
    from sklearn import datasets  # Bundled data: no download.

    digits = datasets.load_digits()
    images = tf.image.resize(
        digits.images[..., None].astype("float32") * (255.0 / 16.0), (28, 28)
    ).numpy()
    ids = np.broadcast_to(
        np.arange(len(images), dtype="float32")[:, None, None, None], images.shape
    )
    with_ids = np.concatenate([images, ids], axis=-1)
    labels = digits.target.astype("uint8")
    return (with_ids[:num_train], labels[:num_train]), (
        with_ids[num_train:],
        labels[num_train:],
    )


class _Counts:
    """Holds the counters outside Keras's tracking (they are not model weights)."""

    train: tf.Variable
    inference: tf.Variable


@keras.utils.register_keras_serializable(package="tfdist_conformance")
class ExampleCounter(keras.layers.Layer):
    """Strips the id channel from images and counts the ids seen.

    Args:
      num_examples: Ids are 0 .. num_examples - 1.
      id_scale: What the pipeline multiplied the images by (the id channel
        arrives as `id * id_scale`).
    """

    def __init__(self, num_examples: int, id_scale: float = 1.0, **kwargs: Any) -> None:
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.num_examples = num_examples
        self.id_scale = id_scale
        self._counts = _Counts()

    def build(self, input_shape: Any) -> None:
        def counter(name: str) -> tf.Variable:
            return tf.Variable(
                tf.zeros([self.num_examples], tf.int32),
                trainable=False,
                name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

        self._counts.train = counter("train_counts")
        self._counts.inference = counter("inference_counts")
        super().build(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_examples": self.num_examples, "id_scale": self.id_scale}

    def compute_output_shape(self, input_shape: Any) -> Any:
        return tuple(input_shape[:-1]) + (input_shape[-1] - 1,)

    def call(self, inputs: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        if tf.distribute.in_cross_replica_context():
            # Keras building the model from a sample batch: not a step.
            return inputs[..., :-1]
        ids = tf.cast(tf.round(inputs[:, 0, 0, -1] / self.id_scale), tf.int32)
        seen = tf.math.bincount(
            ids, minlength=self.num_examples, maxlength=self.num_examples, dtype=tf.int32
        )
        counts = self._counts.train if training else self._counts.inference
        with tf.control_dependencies([counts.assign_add(seen)]):
            return tf.identity(inputs[..., :-1])

    def local_counts(self, strategy: tf.distribute.Strategy) -> dict[str, np.ndarray]:
        """This process's counts (summed over its replicas), by phase."""
        return {
            name: np.sum(
                [v.numpy() for v in strategy.experimental_local_results(var)], axis=0
            )
            for name, var in (("train", self._counts.train), ("inference", self._counts.inference))
        }


def counting_classifier(counter: ExampleCounter, learning_rate: float = 0.01) -> keras.Model:
    """A small compiled classifier of `load_mnist_like` images, `counter` first.

    For the patterns that are not a tutorial's (a tutorial's port keeps its
    own model). Build it under the strategy's scope.
    """
    model = keras.Sequential([
        keras.Input((28, 28, 2)),
        counter,
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class EpochCounts(keras.callbacks.Callback):
    """Keras callback: the training examples counted in each epoch."""

    def __init__(self, counter: ExampleCounter, strategy: tf.distribute.Strategy) -> None:
        super().__init__()
        self._counter = counter
        self._strategy = strategy
        self.per_epoch: list[np.ndarray] = []
        self._before: np.ndarray | None = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._before = self._counter.local_counts(self._strategy)["train"]

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        assert self._before is not None
        self.per_epoch.append(self._counter.local_counts(self._strategy)["train"] - self._before)


def counts_during(counter: ExampleCounter, strategy: tf.distribute.Strategy, phase: str, run: Callable[[], Any]) -> tuple[Any, np.ndarray]:
    """`(run(), how often each example was counted in `phase` meanwhile)`."""
    before = counter.local_counts(strategy)[phase]
    result = run()
    return result, counter.local_counts(strategy)[phase] - before


@dataclasses.dataclass
class Record:
    """What one contender's run of a tutorial produced.

    Attributes:
      error: `"ExceptionType: first line"` if the run failed, else None.
      train_counts: Per epoch, how often each training example was seen.
      weights: The model's final weights.
      inference_counts: Per evaluate/predict call, how often each example
        (training and test ids together) was seen.
      values: Named results (losses, metrics, predictions) to compare.
    """

    error: str | None = None
    train_counts: list[np.ndarray] = dataclasses.field(default_factory=list)
    inference_counts: list[np.ndarray] = dataclasses.field(default_factory=list)
    weights: list[np.ndarray] = dataclasses.field(default_factory=list)
    values: dict[str, Any] = dataclasses.field(default_factory=dict)


def recorded(port: Callable[[str, str], Record], contender: str, workdir: str) -> Record:
    """`port(contender, workdir)`, or a `Record` of the exception it raised."""
    try:
        return port(contender, workdir)
    except Exception as e:  # The contender failed the pattern; record how.
        if os.environ.get("CONFORMANCE_DEBUG"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return Record(error=f"{type(e).__name__}: {first[:300]}")


def run_on_cluster(worker_fn: Callable[..., Record], contender: str, workdir: str) -> tuple[Record, ...]:
    """`worker_fn(contender, workdir)` on every task of a local 2-worker cluster.

    `worker_fn` must be a module-level function that returns a `Record`
    (catching what its tutorial code raises, with `recorded`).
    """
    return tfdist.testing.run_local_cluster(
        worker_fn,
        num_workers=NUM_WORKERS,
        args=(contender, workdir),
        timeout_s=CLUSTER_TIMEOUT_S,
    )


def run_contenders(
    port: Callable[[str, str], Record], workdir: str
) -> dict[str, Record]:
    """Runs `port(contender, directory)` for every contender, each from `SEED`.

    An exception ends that contender's run with `Record(error=...)`.
    """
    records = {}
    for contender in CONTENDERS:
        directory = os.path.join(workdir, contender)
        os.makedirs(directory, exist_ok=True)
        keras.utils.set_random_seed(SEED)
        records[contender] = recorded(port, contender, directory)
    return records


class ConformanceTestCase(tf.test.TestCase):
    """Assertions shared by the tutorial ports."""

    def assert_ran(self, record: Record) -> None:
        self.assertIsNone(record.error, f"the run failed: {record.error}")

    def assert_each_example_once_per_epoch(self, record: Record, num_examples: int, epochs: int) -> None:
        self.assert_ran(record)
        self.assertLen(record.train_counts, epochs)
        self._assert_once_per_epoch(record.train_counts, num_examples)

    def assert_workers_saw_each_example_once_per_epoch(
        self, workers: Sequence[Record], num_examples: int, epochs: int
    ) -> None:
        """Summed over the workers, every training example once per epoch."""
        for record in workers:
            self.assert_ran(record)
            self.assertLen(record.train_counts, epochs)
        self._assert_once_per_epoch(
            [sum(epoch) for epoch in zip(*(r.train_counts for r in workers))],
            num_examples,
        )

    def assert_workers_agree(self, workers: Sequence[Record]) -> None:
        """Every worker ends with the same weights (synchronous training)."""
        for record in workers[1:]:
            for a, b in zip(record.weights, workers[0].weights):
                self.assertAllClose(a, b, rtol=0, atol=0)

    def _assert_once_per_epoch(self, per_epoch: Sequence[np.ndarray], num_examples: int) -> None:
        for epoch, counts in enumerate(per_epoch):
            with self.subTest(epoch=epoch):
                seen = np.bincount(counts[:num_examples], minlength=3)
                self.assertTrue(
                    np.all(counts[:num_examples] == 1),
                    f"epoch {epoch}: {seen[0]} examples never seen, {seen[1]} once, "
                    f"{num_examples - seen[0] - seen[1]} more than once",
                )

    def assert_inference_counts(self, record: Record, expected: list[np.ndarray]) -> None:
        self.assert_ran(record)
        self.assertLen(record.inference_counts, len(expected))
        for got, want in zip(record.inference_counts, expected):
            np.testing.assert_array_equal(got, want)

    def assert_same_results(self, record: Record, reference: Record, *, rtol: float = RTOL, atol: float = ATOL) -> None:
        """Same final weights and every named value as `reference`."""
        self.assert_ran(record)
        self.assert_ran(reference)
        self.assertEqual(sorted(record.values), sorted(reference.values))
        for name in reference.values:
            with self.subTest(value=name):
                self.assertAllClose(record.values[name], reference.values[name], rtol=rtol, atol=atol)
        self.assertLen(record.weights, len(reference.weights))
        for a, b in zip(record.weights, reference.weights):
            self.assertAllClose(a, b, rtol=rtol, atol=atol)
