"""The step ledger: a recorded function marks its ticket after its effects, and only then.

Runs on the default strategy (one process, no cluster): what a ledger
records does not depend on where its variable lives. A worker killed with
a finished step in flight is tested in
tests/integration/parameter_server_fault_test.py.
"""

from __future__ import annotations

import tensorflow as tf

import tfdist
from tfdist.parameter_server import step_ledger


class StepLedgerTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        self.ledger = step_ledger.StepLedger(tf.distribute.get_strategy())
        self.total = tf.Variable(0.0)

        def step(x):  # Its output does not depend on its update.
            self.total.assign_add(x)
            return {"double": 2.0 * x}

        self.function = self.ledger.function(step, autograph=False)
        self.recorded = self.function.get_concrete_function(tf.TensorSpec([], tf.float32))

    def test_a_ticket_is_finished_only_after_its_function_ran(self):
        self.assertFalse(self.ledger.finished(7))
        outputs = self.recorded(7, tf.constant(2.0))
        self.assertEqual(float(outputs["double"]), 4.0)
        self.assertEqual(float(self.total.numpy()), 2.0)
        self.assertTrue(self.ledger.finished(7))
        self.assertFalse(self.ledger.finished(8))

    def test_a_reused_slot_tells_tickets_apart(self):
        self.recorded(3, tf.constant(1.0))
        self.assertFalse(self.ledger.finished(3 + step_ledger.SIZE))
        self.recorded(3 + step_ledger.SIZE, tf.constant(1.0))
        self.assertTrue(self.ledger.finished(3 + step_ledger.SIZE))
        self.assertFalse(self.ledger.finished(3))

    def test_the_mark_waits_for_every_update_of_the_function(self):
        graph = self.recorded.function.graph
        (mark,) = [op for op in graph.get_operations() if op.type == "ResourceScatterNdUpdate"]
        (update,) = [op for op in graph.get_operations() if op.type == "AssignAddVariableOp"]
        self.assertIn(update, _ancestors(mark))
        # And the outputs wait for the mark: outputs on the chief imply a record.
        for output in graph.outputs:
            self.assertIn(mark, _ancestors(output.op), output)


def _ancestors(op: tf.Operation) -> set[tf.Operation]:
    """Every op `op` waits for, through data and control edges."""
    found: set[tf.Operation] = set()
    frontier = {op}
    while frontier:
        frontier = {
            parent
            for current in frontier
            for parent in [t.op for t in current.inputs] + list(current.control_inputs)
        } - found
        found |= frontier
    return found

if __name__ == "__main__":
    tfdist.testing.main()
