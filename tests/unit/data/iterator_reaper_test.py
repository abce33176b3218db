"""The iterators tfdist hands out are destroyed off the thread that drops them.

Destroying a tf.data iterator can wait for the pipeline's autotuning thread
(benchmarks/epoch_boundary.py); Keras drops each epoch's iterator on its
training thread. These tests check where and when the destruction happens,
not how long it takes.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import tensorflow as tf

import tfdist
from tfdist.data.distributed import iterator_reaper

#: Longer than the reaper's poll, with room for a loaded machine.
_WAIT_S = 5.0


class _Thing:
    pass


def _finalizing_thread(obj: object) -> dict[str, str]:
    """A dict that gets the name of the thread that destroys `obj`."""
    seen: dict[str, str] = {}
    weakref.finalize(obj, lambda: seen.setdefault("thread", threading.current_thread().name))
    return seen


def _wait_for(condition) -> bool:
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


#: A process that adopts `Thing`s (whose destruction writes to OUT_DIR),
#: then runs its own lines and exits. It loads the reaper from its file:
#: the module needs the standard library only.
_AT_EXIT_SCRIPT = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("reaper", {path!r})
reaper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reaper)
out_dir = {out_dir!r}

class Thing:
    def __init__(self, name, destroy_s=0.0):
        self.name, self.destroy_s = name, destroy_s
    def __del__(self):
        open(os.path.join(out_dir, self.name + ".started"), "w").close()
        time.sleep(self.destroy_s)
        open(os.path.join(out_dir, self.name + ".destroyed"), "w").close()
"""


def _run_and_exit(test: tf.test.TestCase, lines: str) -> set[str]:
    """Runs `_AT_EXIT_SCRIPT` then `lines` in a fresh interpreter; returns the files written."""
    out_dir = test.create_tempdir().full_path
    script = _AT_EXIT_SCRIPT.format(path=iterator_reaper.__file__, out_dir=out_dir)
    result = subprocess.run(
        [sys.executable, "-c", script + textwrap.dedent(lines)],
        capture_output=True, text=True, timeout=60,
    )
    test.assertEqual(result.returncode, 0, result.stderr)
    return set(os.listdir(out_dir))


class IteratorReaperTest(tf.test.TestCase):
    def test_an_adopted_object_lives_while_held_and_dies_on_the_reaper_thread(self):
        thing = _Thing()
        seen = _finalizing_thread(thing)
        self.assertIs(iterator_reaper.adopt(thing), thing)
        time.sleep(4 * iterator_reaper._POLL_S)
        self.assertEqual(seen, {}, "destroyed while this test still held it")
        del thing
        self.assertTrue(_wait_for(lambda: "thread" in seen), "never destroyed")
        self.assertEqual(seen["thread"], "tfdist-iterator-reaper")

    def test_the_reaper_thread_ends_when_it_holds_nothing(self):
        # What earlier tests of this process left (cyclic garbage holding an
        # iterator is freed only by the collector) is released first.
        gc.collect()
        self.assertTrue(_wait_for(lambda: not iterator_reaper._held),
                        f"held before this test: {iterator_reaper._held}")
        thing = _Thing()
        iterator_reaper.adopt(thing)
        del thing
        self.assertTrue(_wait_for(lambda: iterator_reaper._thread is None))
        self.assertTrue(_wait_for(lambda: not any(
            t.name == "tfdist-iterator-reaper" for t in threading.enumerate())))

    def test_exit_waits_for_a_destruction_under_way(self):
        # Python tearing its modules down under one aborted the process at
        # the end of a resumed job across workers (2026-11-28); without the
        # wait, the destruction here never ends.
        files = _run_and_exit(self, """
            reaper.adopt(Thing("slow", destroy_s=1.0))
            while not os.path.exists(os.path.join(out_dir, "slow.started")):
                time.sleep(0.01)
        """)
        self.assertEqual(files, {"slow.started", "slow.destroyed"})

    def test_exit_leaves_what_is_still_held_undestroyed_and_starts_no_destruction(self):
        # A preempted task exits inside a grace period: destroying its last
        # iterators there costs seconds on a loaded machine.
        files = _run_and_exit(self, """
            kept = reaper.adopt(Thing("kept"))
            reaper._POLL_S = 5.0  # Dropped now; the thread looks again long after exit began.
            time.sleep(0.1)
            reaper.adopt(Thing("dropped_at_exit"))
        """)
        self.assertEqual(files, set())

    def test_a_distributed_datasets_iterator_is_destroyed_off_the_dropping_thread(self):
        strategy = tfdist.MirroredStrategy(["/cpu:0", "/cpu:1"])
        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.range(8).batch(4).map(lambda x: x * 2))
        iterator = iter(dataset)
        self.assertLen(list(iterator), 2)
        seen = _finalizing_thread(iterator)
        del iterator
        self.assertTrue(_wait_for(lambda: "thread" in seen), "never destroyed")
        self.assertEqual(seen["thread"], "tfdist-iterator-reaper")

    def test_fit_leaves_no_iterator_held(self):
        strategy = tfdist.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        dataset = tf.data.Dataset.from_tensor_slices(
            (tf.ones([16, 3]), tf.zeros([16, 1]))).batch(4).prefetch(tf.data.AUTOTUNE)
        # Only this test's iterators: others' may be in the process too.
        earlier = {id(it) for it in iterator_reaper._held}
        model.fit(dataset, epochs=3, verbose=0)
        model.evaluate(dataset, verbose=0)
        del model

        def this_tests_held():
            return [it for it in iterator_reaper._held if id(it) not in earlier]

        self.assertTrue(_wait_for(lambda: not this_tests_held()),
                        f"still held after fit: {this_tests_held()}")


if __name__ == "__main__":
    tf.test.main()
