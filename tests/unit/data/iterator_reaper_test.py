"""The iterators tfdist hands out are destroyed off the thread that drops them.

Destroying a tf.data iterator can wait for the pipeline's autotuning thread
(benchmarks/epoch_boundary.py); Keras drops each epoch's iterator on its
training thread. These tests check where and when the destruction happens,
not how long it takes.
"""

from __future__ import annotations

import gc
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
