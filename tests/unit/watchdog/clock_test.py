"""CollectiveClock: the started/finished counts the watchdog bounds collectives by.

A stand-in "collective" (any op between `before` and `after`) in one
process; the cross-worker behaviour is proven in tests/integration/fault_test.py.
"""

from __future__ import annotations

import tensorflow as tf

import tfdist
from tfdist._internal import tf_errors
from tfdist.watchdog import clock as clock_lib


class CollectiveClockTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.clock = clock_lib.CollectiveClock("/device:CPU:0")

    def test_each_call_counts_one_started_and_one_finished(self):
        @tf.function
        def step(x):
            return self.clock.after(self.clock.before(x) * 2.0)

        for _ in range(3):
            self.assertEqual(float(step(tf.constant(1.0))), 2.0)
        self.assertEqual(self.clock.counts(), (3, 3))

    def test_started_goes_up_only_once_the_input_exists(self):
        seen_while_computing_input = []

        def compute_input(x):
            seen_while_computing_input.append(self.clock.counts())
            return x

        @tf.function
        def step(x):
            x = tf.py_function(compute_input, [x], tf.float32)
            return self.clock.after(self.clock.before(x) + 1.0)

        step(tf.constant(1.0))
        self.assertEqual(seen_while_computing_input, [(0, 0)])
        self.assertEqual(self.clock.counts(), (1, 1))

    def test_a_failed_call_leaves_nothing_in_flight_once_resynced(self):
        @tf.function
        def failing_step(x):
            # A stand-in collective that fails: its result never exists.
            y = tf.debugging.check_numerics(tf.math.log(-self.clock.before(x)), "failed")
            return self.clock.after(y)

        with self.assertRaises(tf.errors.InvalidArgumentError):
            failing_step(tf.constant(1.0))
        self.assertEqual(self.clock.counts(), (1, 0))  # Would look in flight forever.

        remove = tf_errors.install_function_error_hook(lambda error: self.clock.resync())
        try:
            with self.assertRaises(tf.errors.InvalidArgumentError):
                failing_step(tf.constant(1.0))
        finally:
            remove()
        self.assertEqual(self.clock.counts(), (2, 2))


if __name__ == "__main__":
    tfdist.testing.main()
