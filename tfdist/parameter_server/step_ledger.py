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
        after every write above:                # all updates applied
            ledger[ticket % SIZE] = ticket      # one scatter, on the ledger's ps
        return outputs                          # (they wait for the mark)
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

from tfdist.parameter_server import input_packing

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
      function: The `ConcreteFunction`: `function(ticket, *args)`, or, with
        a layout, `function(packed)` of the ticket and args packed by it.
      ledger: Where it records finishing.
      layout: How the ticket and args travel as one tensor
        (`input_packing`), or None: each as it is.
    """

    function: Any  # A tf ConcreteFunction (untyped upstream).
    ledger: StepLedger
    layout: input_packing.Layout | None = None

    def __call__(self, ticket: int, *args: Any) -> Any:
        # The inputs are made on the chief, outside the worker's device
        # scope the caller runs in: made there, each would be copied to the
        # worker at once, blocking every Python thread (about 0.5 ms per
        # tensor); made here, the call sends them with itself.
        # (The call itself stays in the caller's scope: it runs there.)
        with tf.device(None):
            if self.layout is not None:
                packed = tf.constant(self.layout.pack(ticket, args))
            else:
                ticket_tensor = tf.constant(ticket, tf.int64)
        if self.layout is not None:
            return self.function(packed)
        return self.function(ticket_tensor, *args)


class RecordedFunction:
    """`record(fn)` compiled per input signature into `Recorded`s.

    A signature of small dense numeric tensors is compiled to take its
    ticket and args packed into one tensor (`input_packing`): one transfer
    from the chief per call instead of one per tensor.
    """

    def __init__(self, ledger: StepLedger, fn: Callable[..., Any], autograph: bool) -> None:
        self._ledger = ledger
        self._recorded = ledger.record(fn)
        self._autograph = autograph
        self._function = tf.function(self._recorded, autograph=autograph)

    def get_concrete_function(self, *specs: Any, pack: bool = True) -> Recorded:
        """Traces for the argument specs after the ticket (packed where they allow and `pack`)."""
        layout = input_packing.Layout.of(specs) if pack else None
        if layout is None:
            return Recorded(
                self._function.get_concrete_function(TICKET_SPEC, *specs), self._ledger
            )
        recorded = self._recorded

        def unpacking(packed: tf.Tensor) -> Any:
            ticket, args = layout.unpack(packed)
            return recorded(ticket, *args)

        function = tf.function(unpacking, autograph=self._autograph)
        return Recorded(
            function.get_concrete_function(input_packing.Layout.SPEC), self._ledger, layout
        )


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
        """`fn(*args)` as `recorded(ticket, *args)`, which marks `ticket` once fn's writes ran.

        To be traced: the mark depends on every write `fn` created (its
        updates of variables on the ps tasks; `writes_done`), and the
        outputs on the mark (`tf.function`'s automatic control dependencies
        make a function's outputs wait for its stateful ops), so outputs
        that reach the chief imply a recorded function.
        """
        ledger = self._ledger()
        gate = self._gate

        def recorded(ticket: tf.Tensor, *args: Any) -> Any:
            with gate.tracing(ticket) if gate is not None else contextlib.nullcontext():
                outputs = fn(*args)
            graph = tf.compat.v1.get_default_graph()
            written = writes_done(graph, graph.get_operations())  # Outside the scope below.
            # On the ledger's device: the ticket is all that travels there.
            with tf.device(ledger.device), tf.control_dependencies(written):
                ledger.scatter_nd_update(tf.reshape(ticket % SIZE, [1, 1]), tf.reshape(ticket, [1]))
            return outputs

        return recorded

    def finished(self, ticket: int) -> bool:
        """Whether the function of `ticket` recorded its finishing (reads the ps; blocks)."""
        ledger = self._ledger()
        return int(tf.gather(ledger, ticket % SIZE).numpy()) == ticket


#: Stateful ops that only read state: finishing a function does not wait on them.
_READS = frozenset(
    {"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VarIsInitializedOp", "VariableShape"}
)


def writes_done(graph: Any, ops: list[tf.Operation]) -> list[tf.Operation]:
    """What to depend on so as to run after every write among `ops`: one `NoOp` per device.

    A cross-device control edge costs a transfer per edge (TF's graph
    partitioner sends a dummy tensor for each); a step writes tens of
    variables on each ps. Grouped on their device first, the writes of one
    ps task reach another device as one edge. An op's device is its own,
    or that of the variable whose captured handle it takes (its placement
    is the variable's); a write whose task is unknown is depended on
    directly.

    Args:
      graph: The function graph being traced (a `FuncGraph`: its captures
        give the variables' devices).
      ops: Ops of `graph`; the stateful ones that may write are waited for.
    """
    handle_devices = {
        id(internal): external.device
        for external, internal in getattr(graph, "captures", ())
        if getattr(external, "device", "")
    }
    by_device: dict[str, list[tf.Operation]] = {}
    unplaced: list[tf.Operation] = []
    for op in ops:
        if op.type in _READS or not is_stateful(op):
            continue
        # An op made in a replica's scope names only its device type
        # ("/device:CPU:0"); the variable's handle names the task.
        device = op.device if _names_task(op.device) else ""
        device = device or next(
            (handle_devices[id(t)] for t in op.inputs if id(t) in handle_devices), ""
        )
        (by_device.setdefault(device, []) if _names_task(device) else unplaced).append(op)
    grouped = []
    for device, writes in by_device.items():
        with tf.device(device), tf.control_dependencies(writes):
            grouped.append(tf.no_op(name="writes_done"))
    return grouped + unplaced


def _names_task(device: str) -> bool:
    return bool(device) and tf.DeviceSpec.from_string(device).job is not None


def is_stateful(op: tf.Operation) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):  # Ops without a registered OpDef.
        return False
