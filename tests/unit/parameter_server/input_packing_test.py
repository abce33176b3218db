"""Input packing: a step's ticket and batches travel as one tensor, unpacked bit for bit."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tfdist
from tfdist.parameter_server import input_packing
from tfdist.parameter_server import step_ledger


def _spec(value):
    if value is None:
        return None
    return tf.TensorSpec([None, *value.shape[1:]] if value.shape.rank else [], value.dtype)


class InputPackingTest(tf.test.TestCase):

    def test_every_numeric_dtype_and_structure_round_trips_bit_for_bit(self):
        rng = np.random.default_rng(0)
        batch = {
            "features": tf.constant(rng.normal(size=(5, 3)), tf.float32),
            "half": tf.constant(rng.normal(size=(5, 2)), tf.bfloat16),
            "ids": tf.constant(rng.integers(-9, 9, size=(5, 4)), tf.int64),
            "small": tf.constant(rng.integers(-9, 9, size=(5,)), tf.int8),
            "mask": tf.constant(rng.integers(0, 2, size=(5, 2)).astype(bool)),
            "nan": tf.constant([np.nan, -0.0, np.inf, 1.0, 2.0], tf.float64),
        }
        args = (batch, tf.constant(7, tf.int32), None)
        layout = input_packing.Layout.of(tf.nest.map_structure(_spec, args))
        self.assertIsNotNone(layout)
        ticket, unpacked = layout.unpack(tf.constant(layout.pack(1234567, args)))
        self.assertEqual(int(ticket), 1234567)
        self.assertIsNone(unpacked[2])
        for got, sent in zip(tf.nest.flatten(unpacked[:2]), tf.nest.flatten(args[:2])):
            self.assertEqual(got.dtype, sent.dtype)
            self.assertAllEqual(got.shape, sent.shape)
            self.assertEqual(got.numpy().tobytes(), sent.numpy().tobytes())

    def test_values_are_packed_in_the_dtypes_of_the_signature(self):
        # A Python number's spec is 32-bit where numpy makes it 64-bit.
        args = (3, 2.5, tf.constant([1.0, 2.0]))
        layout = input_packing.Layout.of(tuple(tf.type_spec_from_value(a) for a in args))
        _, (i, f, v) = layout.unpack(tf.constant(layout.pack(1, args)))
        self.assertEqual((int(i), float(f)), (3, 2.5))
        self.assertAllEqual(v, [1.0, 2.0])

    def test_unpacked_tensors_keep_the_static_shape_of_the_signature(self):
        specs = ((tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.int32)),)
        layout = input_packing.Layout.of(specs)
        traced = tf.function(lambda packed: layout.unpack(packed)[1]).get_concrete_function(
            input_packing.Layout.SPEC
        )
        (x, y), = traced.structured_outputs
        self.assertEqual(x.shape.as_list(), [None, 3])
        self.assertEqual(y.shape.as_list(), [None])

    def test_strings_ragged_unknown_and_large_examples_are_not_packed(self):
        for specs in [
            (tf.TensorSpec([None], tf.string),),
            (tf.RaggedTensorSpec([None, None], tf.int32),),
            (tf.TensorSpec([None, None], tf.float32),),  # Example size unknown.
            (tf.TensorSpec([None, 32, 32, 3], tf.float32),),  # 12 KiB per example.
        ]:
            self.assertIsNone(input_packing.Layout.of(specs), specs)

    def test_only_calls_of_at_most_max_call_bytes_are_packed(self):
        rows = input_packing.MAX_CALL_BYTES // (4 * 16)
        small = ((tf.zeros([rows, 16]), tf.zeros([rows], tf.int8)),)
        self.assertFalse(input_packing.small_enough(small))  # rows more int8 bytes.
        self.assertTrue(input_packing.small_enough(((tf.zeros([rows, 16]),),)))
        self.assertTrue(input_packing.small_enough(((tf.zeros([64, 16]), None),)))

    def test_a_recorded_step_traced_not_to_pack_takes_its_tensors_as_they_are(self):
        ledger = step_ledger.StepLedger(tf.distribute.get_strategy())
        specs = ((tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None], tf.int32)),)
        recorded = ledger.function(lambda batches: {"n": tf.size(batches[0][1])}, autograph=False)
        unpacked = recorded.get_concrete_function(specs, pack=False)
        self.assertIsNone(unpacked.layout)
        outputs = unpacked(5, ((tf.zeros([3, 2]), tf.constant([1, 2, 3])),))
        self.assertEqual(int(outputs["n"]), 3)
        self.assertTrue(ledger.finished(5))

    def test_a_recorded_step_on_small_batches_takes_one_tensor_and_computes_the_same(self):
        ledger = step_ledger.StepLedger(tf.distribute.get_strategy())
        total = tf.Variable(0.0)

        def step(batches):
            ((x, y),) = batches
            total.assign_add(tf.reduce_sum(x) + tf.cast(tf.reduce_sum(y), tf.float32))
            return {"rows": tf.shape(x)[0]}

        specs = ((tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None], tf.int32)),)
        recorded = ledger.function(step, autograph=False).get_concrete_function(specs)
        self.assertIsNotNone(recorded.layout)
        self.assertLen(recorded.function.inputs, 1 + len(recorded.function.captured_inputs))
        batches = ((tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), tf.constant([1, 2, 3])),)
        outputs = recorded(11, batches)
        self.assertEqual(int(outputs["rows"]), 3)
        self.assertEqual(float(total.numpy()), 27.0)
        self.assertTrue(ledger.finished(11))


if __name__ == "__main__":
    tfdist.testing.main()
