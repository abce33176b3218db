"""Test-process set-up shared by every tier.

- 4 logical CPUs before TensorFlow starts (CONTRIBUTING.md, "Tests").
- One thread per op (`TFDIST_TEST_INTRA_OP_THREADS`, default 1): the test
  processes run side by side on 2 cores (`PYTEST_JOBS`), and each op's own
  thread pool would only oversubscribe them. Every contender of a test runs
  in its process, with the same setting.
- absl flags marked parsed, so absltest helpers such as `create_tempdir`
  work under pytest as they do under `python file.py`; and a temporary
  directory of this process's own for them (`--test_tmpdir`). absl's
  default is one fixed directory, under which `create_tempfile(name)` is
  the same path for the same test wherever it runs: `make test` runs the
  Keras 3 and tf-keras stages side by side, and both runs of one test
  opened the same `model.weights.h5` ("unable to lock file", 2026-11-27).
- Every test under tests/conformance/ marked `conformance`, so one pytest
  run can select the tier by marker (`make test-tfkeras`).
- TF's `MultiDeviceIterator` without its per-device prefetch
  (`_without_device_prefetch`), and the iterators Keras 3 drops kept until
  the test ends (`_dropped_iterators_kept`): a test process crashes
  otherwise, now and then, in TensorFlow.
"""

import atexit
import os
import shutil
import tempfile

import pytest
import tensorflow as tf
from absl import flags
from absl.testing import absltest
from tensorflow.python.data.ops import multi_device_iterator_ops

from tfdist.testing import use_logical_cpus

use_logical_cpus(4)
tf.config.threading.set_intra_op_parallelism_threads(
    int(os.environ.get("TFDIST_TEST_INTRA_OP_THREADS", "1"))
)
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
_TMPDIR = tempfile.mkdtemp(prefix="tfdist-tests-")
flags.FLAGS[absltest.TEST_TMPDIR.name].value = _TMPDIR
atexit.register(shutil.rmtree, _TMPDIR, ignore_errors=True)


def _without_device_prefetch():
    """Builds TF's `MultiDeviceIterator`s with no prefetch on the devices.

    TF's `OneDeviceStrategy` and `MirroredStrategy` (the reference and TF
    contenders of most tests) read a distributed dataset through a
    `MultiDeviceIterator`, whose per-device datasets prefetch: the next
    element's `GetNextFromShard` is in flight as soon as one is taken. Keras
    3 takes one batch at the start of every `fit`, `evaluate` and `predict`
    under a strategy (`_maybe_symbolic_build`) and drops that iterator right
    after (`EpochIterator.reset`), cancelling the pending call in TF's local
    rendezvous, which can segfault (tensorflow/tensorflow#62523). Three full
    runs of the suite died there (2026-11-26, each in a conformance file's
    `setUpClass`, at `reset` after `_maybe_symbolic_build`). Without the
    prefetch an element moves only when it is asked for, nothing is pending
    when Keras drops the iterator, and every element still goes to the same
    replica in the same order: only when it is copied changes. tfdist's
    strategies read through a host iterator and never build one.
    """
    create = multi_device_iterator_ops._create_device_dataset

    def create_without_prefetch(prototype_ds, incarnation_id, prefetch_buffer_size,
                                experimental_slack):
        del prefetch_buffer_size
        return create(prototype_ds, incarnation_id, 0, experimental_slack)

    multi_device_iterator_ops._create_device_dataset = create_without_prefetch


_without_device_prefetch()

#: Iterators Keras 3 dropped during the running test (`_dropped_iterators_kept`).
_DROPPED_ITERATORS: list = []


def _dropped_iterators_kept():
    """Keeps the iterators Keras 3's `EpochIterator.reset` drops until the test ends.

    The segfault above recurred after the prefetch went: at c822c31, and at
    1ebd6fe and ec94f25 on a 2-core machine with AVX512_FP16 (2026-11-27),
    each time in `EpochIterator.reset` in `fit` or `evaluate`, destroying
    the iterator Keras has just read from. A `MultiDeviceIterator`'s host
    buffer is still being filled by TF's background thread then. Kept
    here, an iterator of TF's strategies is destroyed at the test's
    teardown (`pytest_runtest_teardown`), when nothing reads from it.
    tfdist's iterators are left to tfdist (its iterator reaper destroys
    them off Keras's thread, and a test checks it). What each contender
    reads, and in which order, is unchanged.
    """
    from keras.src.trainers import epoch_iterator  # noqa: PLC0415 - Keras 3 only.

    reset = epoch_iterator.EpochIterator.reset

    def reset_keeping_the_iterators(self):
        if type(self._current_iterator).__module__.startswith("tensorflow.python.distribute"):
            _DROPPED_ITERATORS.append((self._current_iterator, self._epoch_iterator))
        reset(self)

    epoch_iterator.EpochIterator.reset = reset_keeping_the_iterators


_dropped_iterators_kept()


def pytest_runtest_teardown(item):
    del item
    _DROPPED_ITERATORS.clear()


def pytest_collection_modifyitems(config, items):
    del config
    for item in items:
        if item.path.parent.name == "conformance":
            item.add_marker(pytest.mark.conformance)
