"""`_dtensor.forwarded_writes`: in a traced step, a `MeshVariable` read after its write is what was written.

The strategy's reason (TF's DTensor may run such a read before the write) is
proven through `fit` in tests/numerics/mesh_fit_test.py; this file pins the
contract: what is forwarded, and what is not (a write in a `tf.cond` branch
read after it, a `tf.while_loop` body, a nested `tf.function`, eager code);
that a forwarded read is a read to `GradientTape`; and a row scatter, which
DTensor cannot run, made one dense update. The tape, loop and nested-function
cases failed before a review found them (2026-11-27).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.experimental import dtensor

import tfdist
from tfdist.mesh import _dtensor


def _variable(value):
    mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(4)])
    value = tf.constant(value, tf.float32)
    return _dtensor.MeshVariable(_dtensor.to_mesh(value, _dtensor.layout(mesh, (None,) * value.shape.rank)))


def _whole(tensor):
    return dtensor.unpack(_dtensor.whole(tensor))[0].numpy()


class ForwardedWritesTest(tf.test.TestCase):

    def _traced(self, step, variable):
        function = tf.function(step)
        with _dtensor.forwarded_writes():
            function.get_concrete_function()  # Traced inside the context, as the strategy traces steps.
        return _whole(function())

    def test_a_read_after_assign_and_assign_add_is_the_written_value(self):
        v = _variable([1.0, 2.0])

        def step():
            v.assign(v.value() * 10.0)
            v.assign_add(tf.ones([2]))
            return v.read_value()

        self.assertAllEqual(self._traced(step, v), [11.0, 21.0])
        self.assertAllEqual(v.numpy(), [11.0, 21.0])

    def test_a_row_scatter_after_a_write_adds_its_rows_and_is_read_back(self):
        v = _variable([[1.0], [2.0], [3.0], [4.0]])
        rows = _on_mesh_like(v, [[5.0], [0.5]])
        indices = _on_mesh_like(v, [1, 1], tf.int32)  # A repeated row: both added.

        def step():
            v.assign(v.value() * 2.0)
            v.scatter_add(tf.IndexedSlices(rows, indices))
            return v.read_value()

        self.assertAllEqual(self._traced(step, v)[:, 0], [2.0, 9.5, 6.0, 8.0])

    def test_a_write_in_a_cond_branch_is_not_forwarded_after_the_branch(self):
        v = _variable([1.0])

        def add():
            v.assign_add([4.0])
            return tf.constant(0)

        def step():
            v.assign([3.0])
            tf.cond(tf.constant(True), add, lambda: tf.constant(0))
            return v.read_value()

        self.assertAllEqual(self._traced(step, v), [7.0])

    def test_a_forwarded_read_is_a_read_to_a_gradient_tape(self):
        # A train_step that writes a weight, then differentiates through it
        # (SAM): the forwarded value must still reach the variable.
        v = _variable([3.0])

        def step():
            v.assign_add(tf.ones([1]))
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(v.value() * v.value())
            return tape.gradient(loss, v)

        self.assertAllEqual(self._traced(step, v), [8.0])

    def test_a_while_loop_body_reads_each_iterations_value_not_the_one_before_the_loop(self):
        v = _variable([1.0])

        def step():
            v.assign([10.0])
            for _ in tf.range(3):
                v.assign(v.value() + 1.0)
            return v.read_value()

        self.assertAllEqual(self._traced(step, v), [13.0])

    def test_a_nested_function_traced_once_reads_the_value_of_each_call(self):
        v = _variable([0.0])
        read = tf.function(lambda: v.read_value())

        def step():
            v.assign([1.0])
            first = read()
            v.assign([2.0])
            return tf.concat([first, read()], 0)

        self.assertAllEqual(self._traced(step, v), [1.0, 2.0])

    def test_eager_writes_are_left_as_they_are(self):
        v = _variable([1.0])
        with _dtensor.forwarded_writes():
            v.assign([2.0])
            v.assign_add([1.0])
            self.assertAllEqual(_whole(v.read_value()), [3.0])


def _on_mesh_like(variable, value, dtype=tf.float32):
    """`value` whole on `variable`'s mesh (made eagerly: DTensor places nothing in a trace)."""
    value = tf.constant(value, dtype)
    return _dtensor.to_mesh(value, dtensor.Layout.replicated(variable.layout.mesh, value.shape.rank))


if __name__ == "__main__":
    tfdist.testing.main()
