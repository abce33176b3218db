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
  (`_without_device_prefetch`), and the iterators Keras 3 drops kept a few
  seconds and destroyed off the test's thread (`_dropped_iterators_kept`):
  a test process crashes otherwise, now and then, in TensorFlow.
- `PYTHONFAULTHANDLER=1` for every process a test starts (cluster tasks,
  launched scripts, their preload templates): a task that dies of a signal
  prints every Python thread's stack to its output, which the test's report
  shows prefixed with the task's name. pytest does the same for its own
  process.
"""

import atexit
import collections
import os
import shutil
import tempfile
import threading
import time

import pytest
import tensorflow as tf
from absl import flags
from absl.testing import absltest
from tensorflow.python.data.ops import multi_device_iterator_ops

from tfdist.testing import use_logical_cpus

use_logical_cpus(4)
os.environ.setdefault("PYTHONFAULTHANDLER", "1")
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

#: How long a dropped iterator of TF's strategies is kept before it is destroyed (seconds).
_KEEP_DROPPED_S = 5.0


class _DroppedIterators:
    """Holds the iterators of TF's strategies that Keras 3 drops; destroys them later, elsewhere.

    `hold` keeps an iterator; a daemon thread destroys each one
    `_KEEP_DROPPED_S` after it was dropped, off the test's thread. Iterators
    still held at interpreter exit are released by `atexit` (while
    TensorFlow is loaded). A forked child starts with none.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: collections.deque = collections.deque()
        self._thread: threading.Thread | None = None
        atexit.register(self.release_all)
        os.register_at_fork(after_in_child=self._reset_in_child)

    def hold(self, *iterators) -> None:
        with self._lock:
            self._held.append((time.monotonic(), iterators))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._release_old, name="tests-dropped-iterators", daemon=True)
                self._thread.start()

    def _release_old(self) -> None:
        while True:
            time.sleep(1.0)
            with self._lock:
                old = []
                while self._held and time.monotonic() - self._held[0][0] > _KEEP_DROPPED_S:
                    old.append(self._held.popleft())
            del old  # Destroys them here, taking as long as TF needs.

    def release_all(self) -> None:
        with self._lock:
            held = list(self._held)
            self._held.clear()
        del held

    def _reset_in_child(self) -> None:
        self._lock = threading.Lock()
        self._held.clear()
        self._thread = None


_DROPPED_ITERATORS = _DroppedIterators()


def _dropped_iterators_kept():
    """Keeps the iterators Keras 3's `EpochIterator.reset` drops a while, and destroys them off its thread.

    The segfault above recurred after the prefetch went: at c822c31, and at
    1ebd6fe and ec94f25 on a 2-core machine with AVX512_FP16 (2026-11-27),
    each time in `EpochIterator.reset` in `fit` or `evaluate`, destroying
    the iterator Keras has just read from (a TensorFlow thread crashed): a
    `MultiDeviceIterator`'s host buffer is still being filled by TF's
    background thread then. Kept here, an iterator of TF's strategies is
    destroyed `_KEEP_DROPPED_S` later, when nothing works on it, on a
    thread of its own. Not at the test's teardown, as at 4785b8f: on a
    loaded machine destroying a whole test's iterators there took up to
    300 s (each destruction waits on TF's threads, which wait to be
    scheduled; 0.03 s alone, 3.9 s beside four busy processes for one
    conformance file). tfdist's iterators are left to tfdist (its iterator
    reaper destroys them off Keras's thread, and a test checks it). What
    each contender reads, and in which order, is unchanged.
    """
    from keras.src.trainers import epoch_iterator  # noqa: PLC0415 - Keras 3 only.

    reset = epoch_iterator.EpochIterator.reset

    def reset_keeping_the_iterators(self):
        if type(self._current_iterator).__module__.startswith("tensorflow.python.distribute"):
            _DROPPED_ITERATORS.hold(self._current_iterator, self._epoch_iterator)
        reset(self)

    epoch_iterator.EpochIterator.reset = reset_keeping_the_iterators


_dropped_iterators_kept()


def pytest_collection_modifyitems(config, items):
    del config
    for item in items:
        if item.path.parent.name == "conformance":
            item.add_marker(pytest.mark.conformance)
