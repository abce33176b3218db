"""A multi-worker strategy changes TensorFlow only while it lives.

Each task of a 2-worker cluster makes `tfdist.MultiWorkerMirroredStrategy`
(whose peer watchdog hooks TF's error class for `tf.function` calls, to
re-class a collective's error naming the lost peer), drops it, and reads
TF's class again: the hook is gone, and its probing thread has stopped.
"""

from __future__ import annotations

import gc
import threading

import pytest
import tensorflow as tf
from tensorflow.python.eager.polymorphic_function import atomic_function

import tfdist

pytestmark = pytest.mark.multiprocess
CLUSTER_TIMEOUT_S = 120


def _hooked() -> bool:
    return hasattr(atomic_function.InterpolateRuntimeError.__exit__, "__wrapped__")


def make_and_drop() -> dict[str, object]:
    """In each task: whether TF's error class is hooked before, during and after a strategy."""
    threads_before = {t.name for t in threading.enumerate()}
    found: dict[str, object] = {"before": _hooked()}
    strategy = tfdist.MultiWorkerMirroredStrategy()
    found["during"] = _hooked()
    with strategy.scope():
        found["sum"] = float(strategy.reduce(
            "SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))
    del strategy
    gc.collect()
    found["after"] = _hooked()
    found["threads_left"] = sorted(
        t.name for t in threading.enumerate()
        if t.name not in threads_before and "watchdog" in t.name.lower())
    return found


class StrategyLifetimeTest(tf.test.TestCase):

    def test_the_error_hook_and_the_probes_end_with_the_strategy(self):
        for task in tfdist.testing.run_local_cluster(
                make_and_drop, num_workers=2, timeout_s=CLUSTER_TIMEOUT_S):
            self.assertEqual(task["sum"], 2.0)
            self.assertEqual(
                (task["before"], task["during"], task["after"]), (False, True, False))
            self.assertEqual(task["threads_left"], [])


if __name__ == "__main__":
    tfdist.testing.main()
