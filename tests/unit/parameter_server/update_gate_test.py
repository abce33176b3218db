"""The update gate: in a recorded function, each variable update is applied once per ticket.

Runs on the default strategy (one process, no cluster), with the ledgers
next to their variables on the local CPU: what the gate decides does not
depend on where the variables live. A worker killed in the middle of a
step's updates is tested in tests/integration/parameter_server_fault_test.py.
"""

from __future__ import annotations

import tensorflow as tf

import tfdist
from tfdist.parameter_server import step_ledger
from tfdist.parameter_server import update_gate


def _local_ledger(size: int) -> tf.Variable:
    return tf.Variable(tf.zeros([size], tf.int64), trainable=False)


class UpdateGateTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.gate = update_gate.UpdateGate()
        self.ledger = step_ledger.StepLedger(tf.distribute.get_strategy(), self.gate)
        self.a = self.gate.adopt(tf.Variable(0.0), _local_ledger)
        self.b = self.gate.adopt(tf.Variable([0.0, 0.0, 0.0]), _local_ledger)

        def step(x):  # Two updates of `a` (one after the other), one of `b`.
            self.a.assign_add(x)
            self.b.scatter_add(tf.IndexedSlices(tf.stack([x, x]), tf.constant([0, 2])))
            self.a.assign_add(10.0 * x)
            return {"double": 2.0 * x}

        self.recorded = self.ledger.function(step, autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.float32)
        )

    def test_a_function_run_again_with_its_ticket_applies_nothing_again(self):
        self.recorded(1, tf.constant(1.0))
        self.assertEqual(float(self.a.numpy()), 11.0)
        self.assertAllEqual(self.b.numpy(), [1.0, 0.0, 1.0])
        outputs = self.recorded(1, tf.constant(1.0))  # TF's re-run of ticket 1.
        self.assertEqual(float(outputs["double"]), 2.0)
        self.assertEqual(float(self.a.numpy()), 11.0)
        self.assertAllEqual(self.b.numpy(), [1.0, 0.0, 1.0])
        self.recorded(2, tf.constant(1.0))  # Another ticket applies.
        self.assertEqual(float(self.a.numpy()), 22.0)

    def test_a_rerun_applies_only_the_updates_its_first_attempt_had_not(self):
        # The first attempt of ticket 5 applied a's first update, then died.
        self.a.assign_add(3.0)
        self.gate.ledger(self.a).scatter_nd_update([[5]], [5 * (1 << 20) + 1])
        self.assertEqual(self.gate.applied(self.a, 5), 1)
        self.assertEqual(self.gate.applied(self.b, 5), 0)
        self.recorded(5, tf.constant(3.0))  # The re-run.
        self.assertEqual(float(self.a.numpy()), 3.0 + 30.0)  # Its second update only.
        self.assertAllEqual(self.b.numpy(), [3.0, 0.0, 3.0])
        self.assertEqual(self.gate.applied(self.a, 5), 2)
        self.assertEqual(self.gate.applied(self.b, 5), 1)

    def test_a_reused_ledger_slot_tells_tickets_apart(self):
        self.recorded(7, tf.constant(1.0))
        self.recorded(7 + step_ledger.SIZE, tf.constant(1.0))
        self.assertEqual(float(self.a.numpy()), 22.0)
        self.assertEqual(self.gate.applied(self.a, 7), 0)
        self.assertEqual(self.gate.applied(self.a, 7 + step_ledger.SIZE), 2)

    def test_updates_outside_a_recorded_function_are_not_gated(self):
        result = self.a.assign_add(4.0)
        self.assertEqual(float(result.numpy()), 4.0)  # TF's own return value.

        @tf.function
        def plain():
            self.a.assign_add(1.0)

        plain()
        plain()
        self.assertEqual(float(self.a.numpy()), 6.0)

    def test_a_rerun_skipping_an_applied_update_writes_no_nan_for_an_infinite_delta(self):
        recorded = self.ledger.function(
            lambda x: self.a.assign_add(x), autograph=False
        ).get_concrete_function(tf.TensorSpec([], tf.float32))
        recorded(3, tf.constant(1.0))
        recorded(3, tf.constant(float("inf")))  # A re-run whose delta is Inf.
        self.assertEqual(float(self.a.numpy()), 1.0)

    def test_updates_in_a_loop_body_are_all_applied(self):
        def loop(x):
            return tf.while_loop(
                lambda i: i < 3, lambda i: (self.a.assign_add(x), i + 1)[1], [0]
            )

        recorded = self.ledger.function(loop, autograph=False).get_concrete_function(
            tf.TensorSpec([], tf.float32)
        )
        recorded(4, tf.constant(1.0))
        self.assertEqual(float(self.a.numpy()), 3.0)  # Ungated there: not one of three.

    def test_the_step_ledger_is_not_adopted(self):
        gate = update_gate.UpdateGate()
        ledger = step_ledger.StepLedger(tf.distribute.get_strategy(), gate)

        def creator(next_creator, **kwargs):  # As the strategy's creator does.
            def make_ledger(size):
                return next_creator(initial_value=tf.zeros([size], tf.int64), trainable=False)

            return gate.adopt(next_creator(**kwargs), make_ledger)

        with tf.variable_creator_scope(creator):
            variable = tf.Variable(0.0)
            bookkeeping = ledger.variable
        self.assertTrue(gate.adopted(variable))
        self.assertFalse(gate.adopted(bookkeeping))

    def test_adopted_variables_checkpoint_and_restore_as_plain_ones(self):
        self.a.assign(2.5)
        path = tf.train.Checkpoint(a=self.a).write(self.create_tempfile().full_path)
        restored = tf.Variable(0.0)
        tf.train.Checkpoint(a=restored).read(path).assert_consumed()
        self.assertEqual(float(restored.numpy()), 2.5)

    def test_an_additive_update_is_one_write_and_one_record_without_a_branch(self):
        ops = self.recorded.function.graph.get_operations()
        self.assertEmpty([op for op in ops if op.type in ("If", "StatelessIf")])
        self.assertLen([op for op in ops if op.type == "AssignAddVariableOp"], 2)
        self.assertLen([op for op in ops if op.type == "ResourceScatterAdd"], 1)
        # One record per update, and the step ledger's own mark.
        self.assertLen([op for op in ops if op.type == "ResourceScatterNdMax"], 3)
        self.assertLen([op for op in ops if op.type == "ResourceScatterNdUpdate"], 1)

    def test_an_assignment_is_skipped_when_a_first_attempt_applied_it(self):
        c = self.gate.adopt(tf.Variable(0.0), _local_ledger)
        recorded = self.ledger.function(
            lambda x: c.assign(x), autograph=False
        ).get_concrete_function(tf.TensorSpec([], tf.float32))
        recorded(9, tf.constant(1.0))
        self.assertEqual(float(c.numpy()), 1.0)
        c.assign(5.0)  # Another step's update, after ticket 9's.
        recorded(9, tf.constant(1.0))  # TF's re-run of ticket 9: no second write.
        self.assertEqual(float(c.numpy()), 5.0)
        recorded(10, tf.constant(2.0))
        self.assertEqual(float(c.numpy()), 2.0)


if __name__ == "__main__":
    tfdist.testing.main()
