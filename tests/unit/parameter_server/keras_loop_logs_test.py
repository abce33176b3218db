"""KerasLoop's per-step logs: asked of one step at a time, and they advance.

Steps run on a fake runner (no cluster) in which a step finishes only once
two more were submitted after it (a window of steps in flight, as on the
workers), with the interval between asked-for logs at zero.
"""

from __future__ import annotations

import types

import numpy as np
import tensorflow as tf

import tfdist
from tfdist.parameter_server import keras_loop

keras = tf.keras


class SlowRunner:
    """A `StepRunner` whose step i finishes when step i + 2 is submitted."""

    blocks_on_steps = False

    def __init__(self):
        self.handles: list[dict] = []
        self._reported = 0
        self.fetched: list[int] = []

    def compile(self, kind, model, keras3):
        del kind, model, keras3
        return types.SimpleNamespace(get_concrete_function=lambda specs: "steps")

    def submit(self, function, batches, steps_per_function, *, logs_wanted=True):
        del function, batches, steps_per_function
        handle = {"index": len(self.handles), "wanted": logs_wanted}
        self.handles.append(handle)
        return handle

    def _finished_count(self):
        return max(0, len(self.handles) - 2)

    def result(self, handle):
        self.fetched.append(handle["index"])
        return {"step": handle["index"]} if handle["wanted"] else None

    def finished(self):
        found = self.handles[self._reported : self._finished_count()]
        self._reported = max(self._reported, self._finished_count())
        return found

    def wait_all(self):
        self._reported = len(self.handles)


class KerasLoopLogsTest(tf.test.TestCase):

    def test_logs_advance_when_steps_finish_later_than_the_logs_are_asked_for(self):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        runner = SlowRunner()
        loop = keras_loop.KerasLoop(
            tf.distribute.get_strategy(), model, runner, exact_counters=lambda variables: None
        )
        data = tf.data.Dataset.from_tensor_slices(np.zeros((40, 2), "float32")).batch(2)
        iterator = keras_loop.ChiefIterator(lambda: iter(data), synchronous=False)
        self.addCleanup(iterator.close)
        saved = keras_loop._LOGS_INTERVAL_S
        keras_loop._LOGS_INTERVAL_S = 0.0
        self.addCleanup(setattr, keras_loop, "_LOGS_INTERVAL_S", saved)

        seen = [loop._run_steps("train", iterator)["step"] for _ in range(20)]

        # The first step's logs are waited for; later ones lag by the window.
        self.assertEqual(seen[0], 0)
        self.assertGreaterEqual(seen[-1], 15)
        self.assertEqual(seen, sorted(seen))
        # Only steps whose logs were asked for are fetched, one at a time.
        wanted = [h["index"] for h in runner.handles if h["wanted"]]
        self.assertEqual(runner.fetched, wanted[: len(runner.fetched)])
        self.assertLess(len(wanted), len(runner.handles))


if __name__ == "__main__":
    tfdist.testing.main()
