"""Which scheduled functions finished, recorded on a ps task: a re-run of one is skipped.

TF's `ClusterCoordinator` queues a function again when its worker fails,
and it decides that a worker failed when *any* call to it fails: the copy
of a finished function's outputs to the chief included. A function whose
updates were all applied on the ps tasks was then run a second time, by
another worker: its step trained twice (measured: a worker killed
mid-epoch made fit run 65 steps of 64, 16 examples counted three times in
two epochs, in 2 of 3 runs).

The ledger makes finishing a function visible where it outlives the
worker, on a ps task:

    function(ticket, *args):                    # traced: `record(fn)`
        outputs = fn(*args)                     # the step: updates on the ps,
                                                # each gated by ticket (update_gate)
        after every stateful op above:          # all updates applied
            ledger[ticket % SIZE] = ticket      # one scatter, on the ledger's ps
        return outputs
    re-run of ticket t (scheduler, on the chief, before calling it again):
        if ledger[t % SIZE] == t: skip it       # it had finished

Guarantee: a function that finished on a worker that then failed is not
run again. One cut short by its worker's death runs again; the updates it
had already sent to the ps are not applied twice because every update of
a recorded function goes through the strategy's `update_gate` (its limits
are stated there). The check reads the ledger, then runs: if TF re-queues
a function while its first attempt still runs (a call to a live worker
failed), both may run.
Tickets are unique per strategy (the scheduler's function count, from 1);
a slot is reused after `SIZE` functions, and the scheduler keeps fewer
than `SIZE` in flight.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tensorflow as tf

if TYPE_CHECKING:
    from tfdist.parameter_server import update_gate

__all__ = ["Recorded", "StepLedger", "TICKET_SPEC", "is_stateful"]

#: Ledger slots: tickets in flight at once must stay below this.
SIZE = 4096
#: The traced signature of a ticket (the first argument of a recorded function).
TICKET_SPEC = tf.TensorSpec([], tf.int64, name="ticket")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A compiled function taking a ticket first, whose finishing the ledger records.

    Attributes:
      function: The `ConcreteFunction` (`function(ticket, *args)`).
      ledger: Where it records finishing.
    """

    function: Any  # A tf ConcreteFunction (untyped upstream).
    ledger: StepLedger

    def __call__(self, ticket: int, *args: Any) -> Any:
        return self.function(tf.constant(ticket, tf.int64), *args)


class RecordedFunction:
    """`tf.function(record(fn))`, traced per input signature into `Recorded`s."""

    def __init__(self, ledger: StepLedger, fn: Callable[..., Any], autograph: bool) -> None:
        self._ledger = ledger
        self._function = tf.function(ledger.record(fn), autograph=autograph)

    def get_concrete_function(self, *specs: Any) -> Recorded:
        """Traces for the argument specs after the ticket."""
        return Recorded(self._function.get_concrete_function(TICKET_SPEC, *specs), self._ledger)


class StepLedger:
    """The ledger variable of one strategy, and the functions that write and read it.

    Args:
      strategy: The parameter-server strategy; the ledger variable is
        created in its scope (on a ps task) on first use.
      gate: The strategy's `update_gate.UpdateGate`, if any: each recorded
        function's updates are gated by its ticket (applied once per
        ticket, a re-run of one cut short included).

    Contract: `record` and `function` are called on the chief's thread that
    compiles steps; `finished` from any coordinator thread.
    """

    def __init__(
        self, strategy: tf.distribute.Strategy, gate: update_gate.UpdateGate | None = None
    ) -> None:
        self._strategy = strategy
        self._gate = gate
        self._variable: tf.Variable | None = None

    @property
    def variable(self) -> tf.Variable:
        """The ledger: an int64 vector of `SIZE` on a ps task (made on first use)."""
        return self._ledger()

    def _ledger(self) -> tf.Variable:
        if self._variable is None:
            # Whole, on one ps task, whatever the user's variable_partitioner;
            # not gated (its record is the step's last write, not an update).
            whole = getattr(self._strategy.extended, "whole_variables", contextlib.nullcontext)
            ungated = self._gate.passing_over if self._gate else contextlib.nullcontext
            with self._strategy.scope(), whole(), ungated():
                self._variable = tf.Variable(
                    tf.zeros([SIZE], tf.int64), trainable=False, name="tfdist_step_ledger"
                )
        return self._variable

    def function(self, fn: Callable[..., Any], *, autograph: bool) -> RecordedFunction:
        """`fn` compiled with its finishing recorded (see `record`)."""
        return RecordedFunction(self, fn, autograph)

    def record(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn(*args)` as `recorded(ticket, *args)`, which marks `ticket` once fn's effects ran.

        To be traced: the mark depends on every stateful op `fn` created
        (its updates of variables on the ps tasks), and the outputs on the
        mark, so outputs that reach the chief imply a recorded function.
        """
        ledger = self._ledger()
        gate = self._gate

        def recorded(ticket: tf.Tensor, *args: Any) -> Any:
            with gate.tracing(ticket) if gate is not None else contextlib.nullcontext():
                outputs = fn(*args)
            graph = tf.compat.v1.get_default_graph()
            effects = [op for op in graph.get_operations() if is_stateful(op)]
            leaves = [t for t in tf.nest.flatten(outputs) if isinstance(t, tf.Tensor)]
            with tf.control_dependencies(effects + leaves):
                mark = ledger.scatter_nd_update(
                    tf.reshape(ticket % SIZE, [1, 1]), tf.reshape(ticket, [1])
                )
            with tf.control_dependencies([mark]):
                return tf.nest.map_structure(
                    lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, outputs
                )

        return recorded

    def finished(self, ticket: int) -> bool:
        """Whether the function of `ticket` recorded its finishing (reads the ps; blocks)."""
        ledger = self._ledger()
        return int(tf.gather(ledger, ticket % SIZE).numpy()) == ticket


def is_stateful(op: tf.Operation) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):  # Ops without a registered OpDef.
        return False
