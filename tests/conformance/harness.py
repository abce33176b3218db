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
model is otherwise unchanged (its first layer sees one channel). Models on
flat features get the id as their last feature instead (`flat_images`,
`with_ids`); the counter strips and counts it the same way. Keras's `fit`
reports the training counts per epoch through `EpochCounts`; custom training
loops through `PhaseCounts`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import tempfile
import unittest
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

import tfdist
from tests.front_end import KERAS_3
from tests.front_end import TF_CONTENDER

keras = tf.keras

#: Whether tf.keras is Keras 3 (else tf-keras, TF_USE_LEGACY_KERAS=1).
NUM_REPLICAS = 4
DEVICES = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]
SEED = 7
#: Examples `load_mnist_like` has (scikit-learn's digits): ids are below it.
NUM_DIGITS = 1797
CONTENDERS = ("one_device", "tf", "tfdist") if TF_CONTENDER else ("one_device", "tfdist")
_NO_TF_CONTENDER = (
    "checks TF's own strategy, left out of this run (TFDIST_TEST_TF_CONTENDER=0, "
    "as in `make test`); `make test-all` runs it"
)


def needs_tf_contender(test: Callable[..., Any]) -> Callable[..., Any]:
    """Skips `test` (it reads TF's strategy's record) in a run without that contender."""
    return unittest.skipUnless(TF_CONTENDER, _NO_TF_CONTENDER)(test)


def skip_unless_run(test: unittest.TestCase, contender: str) -> None:
    """Skips `test` if `contender` (one of a parameterized test's) is not run here."""
    if contender == "tf" and not TF_CONTENDER:
        test.skipTest(_NO_TF_CONTENDER)

#: Same examples, same order, same initial weights: the runs differ in how
#: float32 sums are grouped (per replica, then across replicas). Over a few
#: Adam steps on a small conv net that stays within these.
RTOL = 1e-4
ATOL = 1e-5


#: Workers of the multi-worker ports, and their bound (start-up included).
NUM_WORKERS = 2
CLUSTER_TIMEOUT_S = 180

#: How far apart the collective keys of TF's strategies are (see `make_strategy`).
TF_COLLECTIVE_KEY_STRIDE = 100_000
_tf_key_bases = itertools.count(TF_COLLECTIVE_KEY_STRIDE, TF_COLLECTIVE_KEY_STRIDE)


def new_tf_key_base() -> int:
    """A collective key base that no TF strategy of this process has used."""
    return next(_tf_key_bases)


def make_strategy(
    contender: str,
    cross_device_ops: tf.distribute.CrossDeviceOps | None = None,
    *,
    tf_key_base: int | None = None,
) -> tf.distribute.Strategy:
    """The contender's strategy, built as its tutorial builds TF's.

    TF's `MirroredStrategy` on CPUs all-reduces with collective ops whose
    group keys start at 1 + its `_collective_key_base` (0) in every
    instance, and TF's runtime remembers each (group, instance) key's shape
    for the whole process: a second TF strategy whose collectives have other
    shapes fails ("Shape mismatch in the collective instance 100"), and one
    that failed mid-step can leave later ones aborted. `pytest tests` runs
    every file in one process, so each TF strategy here gets keys of its own
    (`tf_key_base`), as TF's own tests do
    (tensorflow/python/distribute/strategy_combinations.py); tfdist's
    strategy is built untouched.

    Args:
      contender: One of `CONTENDERS`, or "tfdist_layer_placement" (the
        model's layers over `DEVICES`; layer_placement_patterns_test.py), or
        "tfdist_mesh" (a 2 x 2 mesh of `DEVICES`, layouts chosen
        automatically; mesh_patterns_test.py), or a multi-worker contender.
      cross_device_ops: TF's constructor argument, for tutorials that pass
        one (e.g. `tf.distribute.HierarchicalCopyAllReduce()`); given to TF's
        strategy and to tfdist's (which takes TF's arguments), not to one
        device (which reduces nothing).
      tf_key_base: For TF's strategy: its collective key base; `None` for a
        new one. Strategies given the same base share keys, as any two TF
        strategies of a fresh process do.
    """
    if contender == "one_device":
        # A strategy, not none: Keras 3 then starts the same extra iterator
        # to build the model as with the others, so a reshuffling pipeline
        # gives every contender the same epochs.
        return tf.distribute.OneDeviceStrategy(DEVICES[0])
    if contender == "tf":
        return tf_mirrored_strategy(DEVICES, cross_device_ops, tf_key_base=tf_key_base)
    if contender == "tfdist":
        return tfdist.MirroredStrategy(DEVICES, cross_device_ops=cross_device_ops)
    if contender == "tfdist_layer_placement":
        # Stages over the same logical CPUs, 4 microbatches a step.
        return tfdist.LayerPlacementStrategy(DEVICES, num_microbatches=NUM_REPLICAS)
    if contender == "tfdist_mesh":
        # The batch split 2 ways, each layer Megatron's way over the other 2.
        return tfdist.MeshStrategy(
            tfdist.mesh.DeviceMesh((2, 2), ("batch", "model"), DEVICES), layout_map=None)
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


def tf_mirrored_strategy(
    devices: Sequence[str],
    cross_device_ops: tf.distribute.CrossDeviceOps | None = None,
    *,
    tf_key_base: int | None = None,
) -> tf.distribute.MirroredStrategy:
    """TF's `MirroredStrategy(devices, cross_device_ops)` with collective keys of its own.

    Any test that runs TF's strategy's collectives in a process other test
    files share must build it here (see `make_strategy`): with TF's default
    keys it fails, or is cancelled, after another TF strategy whose
    collectives had other shapes.
    """
    cls = tf.distribute.MirroredStrategy
    default_base = cls._collective_key_base
    # Read by the strategy's constructor only.
    cls._collective_key_base = new_tf_key_base() if tf_key_base is None else tf_key_base
    try:
        return cls(list(devices), cross_device_ops=cross_device_ops)
    finally:
        cls._collective_key_base = default_base


def load_mnist_like(
    num_train: int = 1440, num_test: int | None = None
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train_images, train_labels), (test_images, test_labels), MNIST-shaped.

    Images are float32 in [0, 255] with shape (n, 28, 28, 2): channel 0 the
    digit, channel 1 the example's id (train: 0..n-1, test: continuing), so
    `ExampleCounter` can count them. Labels are uint8 in 0..9. The test set
    is the `num_test` digits after the training set (`None`: all the rest);
    ids stay below `NUM_DIGITS` either way.
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
    end = None if num_test is None else num_train + num_test
    return (with_ids[:num_train], labels[:num_train]), (
        with_ids[num_train:end],
        labels[num_train:end],
    )


def flat_images(images: np.ndarray) -> np.ndarray:
    """`load_mnist_like` images as models on `reshape(-1, 784)` get them.

    Returns float32 of shape (n, 785): the 784 pixels of channel 0, then the
    example's id (what `ExampleCounter` strips and counts).
    """
    pixels = images[..., 0].reshape(len(images), -1)
    return np.concatenate([pixels, images[:, 0, 0, 1:]], axis=1)


def with_ids(features: np.ndarray, first_id: int = 0) -> np.ndarray:
    """`features` (n, k) with a last column of ids first_id .. first_id + n - 1."""
    ids = np.arange(first_id, first_id + len(features), dtype=features.dtype)
    return np.concatenate([features, ids[:, None]], axis=1)


def local_rows(strategy: tf.distribute.Strategy, value: Any) -> Any:
    """`value` (a nest of per-replica values) with each leaf's local results joined.

    Each leaf becomes one numpy array: the replicas' rows concatenated in
    replica order (stacked, for scalars), as one device would hold them.
    Replicas without rows (TF pads a partial step with empty values whose
    other dimensions may be 0 too) add nothing.
    """

    def join(leaf: Any) -> np.ndarray:
        parts = [np.asarray(part) for part in strategy.experimental_local_results(leaf)]
        if not parts[0].ndim:
            return np.stack(parts)
        return np.concatenate([part for part in parts if len(part)] or parts[:1])

    return tf.nest.map_structure(join, value)


class _Counts:
    """Holds the counters outside Keras's tracking (they are not model weights)."""

    train: tf.Variable
    inference: tf.Variable


@keras.utils.register_keras_serializable(package="tfdist_conformance")
class ExampleCounter(keras.layers.Layer):
    """Strips the id channel from images and counts the ids seen.

    The id is the last channel of an image (n, h, w, c + 1), or the last
    feature of a flat row (n, k + 1); what follows gets the rest.

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
        if tf.distribute.in_cross_replica_context() or not tf.distribute.has_strategy():
            # Keras building the model from a sample batch, or a call outside
            # `strategy.run` and the scope (e.g. a custom loop's plain test
            # step): not a replica's step, so nothing is counted.
            return inputs[..., :-1]
        id_channel = inputs[..., -1]
        id_channel = tf.reshape(id_channel, [tf.shape(id_channel)[0], -1])
        ids = tf.cast(tf.round(id_channel[:, 0] / self.id_scale), tf.int32)
        # A sum of one-hot rows, not `tf.math.bincount`: TF's DTensor (the
        # mesh strategy) has no layout rule for DenseBincount.
        seen = tf.reduce_sum(tf.one_hot(ids, self.num_examples, dtype=tf.int32), axis=0)
        counts = self._counts.train if training else self._counts.inference
        with tf.control_dependencies([counts.assign_add(seen)]):
            return tf.identity(inputs[..., :-1])

    def local_counts(self, strategy: tf.distribute.Strategy) -> dict[str, np.ndarray]:
        """This process's counts (summed over its replicas), by phase.

        Zeros while the layer is not built (a model built at its first step).
        """
        if not self.built:
            zeros = np.zeros([self.num_examples], np.int32)
            return {"train": zeros, "inference": zeros}
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


class PhaseCounts:
    """For custom loops: how often each example was counted, per block.

    Example:
      counts = PhaseCounts(counter, strategy)
      for epoch in range(EPOCHS):
          with counts.counting("train"):
              for x in dist_dataset:
                  ...
      counts.train  # one array per block

    Attributes:
      train: Per `counting("train")` block, the training counts.
      inference: Per `counting("inference")` block, the inference counts.
    """

    def __init__(self, counter: ExampleCounter, strategy: tf.distribute.Strategy) -> None:
        self._counter = counter
        self._strategy = strategy
        self.train: list[np.ndarray] = []
        self.inference: list[np.ndarray] = []

    @contextlib.contextmanager
    def counting(self, phase: str) -> Iterator[None]:
        """Appends to `self.<phase>` what the block counted in `phase`."""
        before = self._counter.local_counts(self._strategy)[phase]
        yield
        getattr(self, phase).append(self._counter.local_counts(self._strategy)[phase] - before)


def counts_during(counter: ExampleCounter, strategy: tf.distribute.Strategy, phase: str, run: Callable[[], Any]) -> tuple[Any, np.ndarray]:
    """`(run(), how often each example was counted in `phase` meanwhile)`."""
    before = counter.local_counts(strategy)[phase]
    result = run()
    return result, counter.local_counts(strategy)[phase] - before


#: Characters of a failure's message that a `Record` keeps.
MAX_ERROR_DETAIL = 5000


def counter_of(model: Any) -> ExampleCounter:
    """The `ExampleCounter` among `model`'s layers (e.g. of a restored model)."""
    return next(layer for layer in model.layers if isinstance(layer, ExampleCounter))


def fit_counting(model: Any, strategy: tf.distribute.Strategy, record: Record, **fit_kwargs: Any) -> dict[str, Any]:
    """`model.fit(**fit_kwargs)`'s history, counting what it reads into `record`.

    Appends each epoch's training counts to `record.train_counts` and, when
    `fit` validated (its history has `val_` entries), the validation counts
    of the whole call to `record.inference_counts`.
    """
    counter = counter_of(model)
    epoch_counts = EpochCounts(counter, strategy)
    fit_kwargs["callbacks"] = list(fit_kwargs.get("callbacks") or []) + [epoch_counts]
    history, validation_counts = counts_during(
        counter, strategy, "inference", lambda: model.fit(**fit_kwargs)
    )
    record.train_counts.extend(epoch_counts.per_epoch)
    if any(name.startswith("val_") for name in history.history):
        record.inference_counts.append(validation_counts)
    return history.history


class _WarningMessages(logging.Handler):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.WARNING)
        self._messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self._messages.append(record.getMessage())


@contextlib.contextmanager
def absl_warnings() -> Iterator[list[str]]:
    """Inside, the messages of absl's warnings (tfdist's) are appended to the list it yields."""
    messages: list[str] = []
    handler = _WarningMessages(messages)
    absl_logging.get_absl_logger().addHandler(handler)
    try:
        yield messages
    finally:
        absl_logging.get_absl_logger().removeHandler(handler)


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
      error_detail: The failure's message without stack lines (up to
        `MAX_ERROR_DETAIL` characters): TF's runtime errors name the failing
        op after a first line such as "Graph execution error:".
    """

    error: str | None = None
    error_detail: str = ""
    train_counts: list[np.ndarray] = dataclasses.field(default_factory=list)
    inference_counts: list[np.ndarray] = dataclasses.field(default_factory=list)
    weights: list[np.ndarray] = dataclasses.field(default_factory=list)
    values: dict[str, Any] = dataclasses.field(default_factory=dict)


def _record_failure(record: Record, error: Exception) -> None:
    """Sets `record.error` and `record.error_detail` from `error`."""
    lines = [
        line
        for line in str(error).strip().splitlines()
        # TF's runtime errors list the Python stack that defined the op.
        if line.strip() and not line.lstrip().startswith("File ")
    ]
    record.error = f"{type(error).__name__}: {lines[0][:300] if lines else ''}"
    record.error_detail = "\n".join(lines)[:MAX_ERROR_DETAIL]


def recorded_call(record: Record, call: Callable[[], Any]) -> Any:
    """`call()`, or None with its exception recorded in `record` (one failure kept).

    With `CONFORMANCE_DEBUG` set in the environment the exception propagates.
    """
    if record.error is not None:
        return None
    try:
        return call()
    except Exception as e:  # The contender failed the pattern; record how.
        if os.environ.get("CONFORMANCE_DEBUG"):
            raise
        _record_failure(record, e)
        return None


def keeps_partial_results(
    port: Callable[[str, str, Record], None],
) -> Callable[[str, str], Record]:
    """Adapts a port that fills the `Record` it is given as it goes.

    For tutorials whose later cells build on earlier ones: when a cell
    fails, the record keeps what the cells before it produced (and the
    error), so tests can tell which part of the tutorial a contender passed.
    """

    def run(contender: str, workdir: str) -> Record:
        record = Record()
        recorded_call(record, lambda: port(contender, workdir, record))
        return record

    return run


def recorded(port: Callable[[str, str], Record], contender: str, workdir: str) -> Record:
    """`port(contender, workdir)`, or a `Record` of the exception it raised."""
    failure = Record()
    result = recorded_call(failure, lambda: port(contender, workdir))
    return failure if failure.error is not None else result


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


def expected_counts(num_examples: int, ids: Any, times: int = 1) -> np.ndarray:
    """Counts over ids 0 .. num_examples - 1: `times` for `ids`, else 0."""
    counts = np.zeros([num_examples], np.int64)
    counts[ids] = times
    return counts


class ConformanceTestCase(tf.test.TestCase):
    """Assertions shared by the tutorial ports."""

    @classmethod
    def run_in_tempdir(cls, port: Callable[[str, str], Record]) -> dict[str, Record]:
        """`run_contenders(port, ...)` in a fresh directory, removed after the class."""
        workdir = tempfile.mkdtemp(prefix=f"{cls.__name__}_")
        cls.addClassCleanup(shutil.rmtree, workdir, ignore_errors=True)
        return run_contenders(port, workdir)

    def assert_failed_with(self, record: Record, error_type: str, message_part: str) -> None:
        """The run failed with `error_type` and a message containing `message_part`."""
        self.assertIsNotNone(record.error, "the run succeeded")
        self.assertStartsWith(record.error, f"{error_type}: ")
        self.assertIn(message_part, record.error_detail)

    def assert_ran(self, record: Record) -> None:
        self.assertIsNone(record.error, f"the run failed: {record.error}")

    def assert_each_example_once_per_epoch(
        self, record: Record, num_examples: int, epochs: int, *, first_epoch: int | None = None
    ) -> None:
        """Training examples 0 .. num_examples - 1 were seen once in each epoch.

        Args:
          record: The contender's record.
          num_examples: Training examples (ids 0 .. num_examples - 1).
          epochs: How many epochs: the whole run's, or from `first_epoch`.
          first_epoch: `None` to check the whole run (which must have
            succeeded and trained exactly `epochs` epochs); else check
            `epochs` epochs from this one (the run may have failed later).
        """
        if first_epoch is None:
            self.assert_ran(record)
            self.assertLen(record.train_counts, epochs)
            first_epoch = 0
        window = record.train_counts[first_epoch : first_epoch + epochs]
        self.assertLen(window, epochs, f"the run stopped before: {record.error}")
        self._assert_once_per_epoch(window, num_examples, first_epoch)

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

    def _assert_once_per_epoch(
        self, per_epoch: Sequence[np.ndarray], num_examples: int, first_epoch: int = 0
    ) -> None:
        for epoch, counts in enumerate(per_epoch, start=first_epoch):
            with self.subTest(epoch=epoch):
                seen = np.bincount(counts[:num_examples], minlength=3)
                self.assertTrue(
                    np.all(counts[:num_examples] == 1),
                    f"epoch {epoch}: {seen[0]} examples never seen, {seen[1]} once, "
                    f"{num_examples - seen[0] - seen[1]} more than once",
                )

    def assert_inference_counts(self, record: Record, expected: list[np.ndarray]) -> None:
        """Per evaluate/predict call (or counted block), the counts `expected`.

        The run may have failed after the last of them.
        """
        self.assertLen(record.inference_counts, len(expected), f"the run stopped before: {record.error}")
        for got, want in zip(record.inference_counts, expected):
            np.testing.assert_array_equal(got, want)

    def assert_values_match(
        self, record: Record, reference: Record, names: list[str], *, rtol: float = RTOL, atol: float = ATOL
    ) -> None:
        """The values `names` match `reference`'s (either run may have failed later)."""
        for name in names:
            with self.subTest(value=name):
                if name not in reference.values:
                    self.fail(f"the reference did not reach {name!r}: {reference.error}")
                if name not in record.values:
                    self.fail(f"the run did not reach {name!r}: {record.error}")
                self.assertAllClose(record.values[name], reference.values[name], rtol=rtol, atol=atol)

    def assert_same_results(
        self,
        record: Record,
        reference: Record,
        *,
        rtol: float = RTOL,
        atol: float = ATOL,
        value_atol: dict[str, float] | None = None,
    ) -> None:
        """Same final weights and every named value as `reference` (`value_atol`: atol by value name)."""
        self.assert_ran(record)
        self.assert_ran(reference)
        self.assertEqual(sorted(record.values), sorted(reference.values))
        for name in reference.values:
            with self.subTest(value=name):
                self.assertAllClose(
                    record.values[name],
                    reference.values[name],
                    rtol=rtol,
                    atol=(value_atol or {}).get(name, atol),
                )
        self.assertLen(record.weights, len(reference.weights))
        for a, b in zip(record.weights, reference.weights):
            self.assertAllClose(a, b, rtol=rtol, atol=atol)
