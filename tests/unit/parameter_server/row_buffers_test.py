"""Row buffers: a sync step's sparse gradients reach the optimizer as one device's rows."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfdist.parameter_server import row_buffers


def _gradient(indices, values):
    return tf.IndexedSlices(
        tf.constant(values, tf.float32), indices, tf.constant([6, 2], tf.int64)
    )


class KeepsRowsTest(tf.test.TestCase):

    def test_rows_of_batch_indices_are_kept_constant_ones_and_dense_are_not(self):
        found = {}

        @tf.function
        def trace(ids):
            found["batch"] = row_buffers.keeps_rows(_gradient(ids, [[1.0, 1.0]] * 3))
            found["constant"] = row_buffers.keeps_rows(_gradient(tf.range(3), [[1.0, 1.0]] * 3))
            found["dense"] = row_buffers.keeps_rows(tf.ones([6, 2]))
            return ids

        trace(tf.constant([1, 1, 2]))
        self.assertEqual(found, {"batch": True, "constant": False, "dense": False})


class RowBuffersTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.table = tf.Variable(tf.zeros([6, 2]))
        self.buffers = row_buffers.RowBuffers(num_slices=2)
        # Two slices of a batch of 3 looking up tokens: index 1 occurs in both.
        self.parts = [
            (0, tf.constant([1, 4]), [[1.0, 2.0], [3.0, 4.0]], 2),
            (1, tf.constant([1]), [[5.0, 6.0]], 1),
        ]

    def _write_all(self):
        @tf.function
        def write(index, indices, values, size):
            return self.buffers.write(index, self.table, _gradient(indices, values), size)

        return [write(i, ids, values, size) for i, ids, values, size in self.parts]

    def test_a_variable_is_noted_on_its_first_trace_then_buffered(self):
        self.assertFalse(self.buffers.has(self.table))
        self.assertFalse(self._write_all()[0])
        self.assertTrue(self.buffers.create(tf.distribute.get_strategy()))
        self.assertTrue(self.buffers.has(self.table))
        self.assertFalse(self.buffers.create(tf.distribute.get_strategy()))

    def test_the_apply_sees_every_rows_of_every_slice_scaled_by_its_size_over_n(self):
        self._write_all()
        self.buffers.create(tf.distribute.get_strategy())
        self._write_all()  # Traced again, with buffers: now they are written.

        @tf.function
        def apply(scale):
            gradient = self.buffers.gradient(self.table, scale)
            squares = tf.math.unsorted_segment_sum(
                tf.square(gradient.values), gradient.indices, 6
            )
            dense = tf.convert_to_tensor(gradient)
            with tf.control_dependencies([squares, dense]):
                self.buffers.clear()
            return gradient.values, gradient.indices, gradient.dense_shape, squares, dense

        values, indices, shape, squares, dense = apply(tf.constant(1 / 3))
        # Each slice's gradient is of its mean loss: rows * n_i / N are one device's rows.
        np.testing.assert_allclose(values, [[2 / 3, 4 / 3], [2.0, 8 / 3], [5 / 3, 2.0]], rtol=1e-6)
        self.assertAllEqual(indices, [1, 4, 1])
        self.assertAllEqual(shape, [6, 2])
        # What a squaring optimizer adds up per index: the rows' squares, not the sum's.
        np.testing.assert_allclose(squares[1], [(2 / 3) ** 2 + (5 / 3) ** 2, (4 / 3) ** 2 + 4.0],
                                   rtol=1e-6)
        np.testing.assert_allclose(dense[1], [7 / 3, 10 / 3], rtol=1e-6)
        # Emptied for the next step.
        values, indices, _, _, _ = apply(tf.constant(1.0))
        self.assertEqual(values.shape, (0, 2))
        self.assertEqual(indices.shape, (0,))

    def test_a_slice_that_did_not_run_adds_no_rows(self):
        self._write_all()
        self.buffers.create(tf.distribute.get_strategy())

        @tf.function
        def write_first():
            index, ids, values, size = self.parts[0]
            return self.buffers.write(index, self.table, _gradient(ids, values), size)

        write_first()
        gradient = tf.function(lambda: self.buffers.gradient(self.table, tf.constant(0.5)))()
        self.assertAllEqual(gradient.indices, [1, 4])


if __name__ == "__main__":
    tf.test.main()
