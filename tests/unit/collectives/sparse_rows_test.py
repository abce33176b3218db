"""tfdist.collectives.sparse_rows: which sparse gradient rows stand for the same rows."""

from __future__ import annotations

import tensorflow as tf

from tfdist.collectives import sparse_rows

DENSE_SHAPE = tf.constant([10, 2], tf.int64)


def _slices(indices):
    values = tf.ones([4, 2]) * tf.cast(tf.reshape(indices, [-1, 1]), tf.float32)
    return tf.IndexedSlices(values, indices, DENSE_SHAPE)


class RowsAlignTest(tf.test.TestCase):

    def _aligned(self, make_indices, *args):
        answers = []

        @tf.function
        def step(*inputs):
            answers.append(sparse_rows.rows_align([_slices(make_indices(*inputs)) for _ in range(2)]))
            return tf.constant(0)

        step(*args)
        return answers[0]

    def test_constant_indices_align(self):
        self.assertTrue(self._aligned(lambda: tf.range(4)))
        self.assertTrue(self._aligned(lambda: tf.cast(tf.range(4) * 2 + 1, tf.int64)))

    def test_indices_from_the_batch_do_not(self):
        self.assertFalse(self._aligned(lambda batch: batch[:4], tf.constant([1, 2, 3, 4, 5])))

    def test_indices_from_a_shape_of_the_batch_do_not(self):
        # A dynamic shape may differ between replicas (the last partial batch).
        spec = tf.TensorSpec([None], tf.int32)
        answers = []

        @tf.function(input_signature=[spec])
        def step(batch):
            answers.append(sparse_rows.rows_align(
                [_slices(tf.range(tf.shape(batch)[0])[:4]) for _ in range(2)]))
            return tf.constant(0)

        step(tf.constant([1, 2, 3, 4]))
        self.assertFalse(answers[0])

    def test_random_and_variable_indices_do_not(self):
        table = tf.Variable([0, 1, 2, 3])
        self.assertFalse(self._aligned(lambda: tf.random.uniform([4], maxval=10, dtype=tf.int32)))
        self.assertFalse(self._aligned(lambda: tf.identity(table.read_value())))

    def test_eager_indices_do_not(self):
        self.assertFalse(sparse_rows.rows_align([_slices(tf.range(4)), _slices(tf.range(4))]))

    def test_parts_of_different_shapes_do_not(self):
        answers = []

        @tf.function
        def step():
            answers.append(sparse_rows.rows_align([
                _slices(tf.range(4)),
                tf.IndexedSlices(tf.ones([3, 2]), tf.range(3), DENSE_SHAPE),
            ]))
            return tf.constant(0)

        step()
        self.assertFalse(answers[0])

    def test_sum_aligned_adds_rows_in_place(self):
        parts = [tf.IndexedSlices(tf.constant([[1.0], [2.0]]) * k, tf.constant([3, 5]), DENSE_SHAPE)
                 for k in (1.0, 10.0)]

        total = sparse_rows.sum_aligned(parts)

        self.assertAllEqual(total.indices, [3, 5])
        self.assertAllClose(total.values, [[11.0], [22.0]])


if __name__ == "__main__":
    tf.test.main()
