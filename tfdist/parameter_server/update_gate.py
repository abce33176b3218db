"""Each variable update of a scheduled function applied once, whatever TF re-runs.

TF's `ClusterCoordinator` runs a function again, on another worker, when its
worker fails. The step ledger (`step_ledger`) skips the re-run of a function
that had finished. One that was cut short had often sent part of its
updates already: a step's updates reach the ps tasks one variable at a
time, as the backward pass produces each gradient (the last layer's first),
and a forward-pass update (a metric, a counter) lands before any of them.
Re-run whole, such a step applies those updates a second time.

The gate makes every update idempotent per function run. Each variable
created in the strategy's scope (`adopt`) sends its updates (`assign`,
`assign_add`, `assign_sub`, `scatter_*`) through the gate; inside a
function the step ledger records (`tracing(ticket)`), the `j`-th update of
variable `v` in the function is traced on `v`'s ps task as:

    with device(v.device):                  # slot, base: once per ps
        seen = ledger_v[slot]                   # slot = ticket % SIZE; entries are
                                                # ticket * STRIDE + updates applied
        applied = seen > base + j               # base = ticket * STRIDE: an earlier
                                                # attempt of this ticket applied it
    additive (assign_add/sub, scatter_add/sub, scatter_nd_add/sub):
        v.update(0 if applied else delta)
        then ledger_v[slot] = max(ledger_v[slot], base + j + 1)
    any other (assign, scatter_update, ...): one If op
        if not applied: v.update(...); then the same max()

The write and its record run on the ps once their inputs (the update's
values, computed on the worker) are there, without the worker. So a
worker's death leaves each update of the step either applied and recorded,
or not applied; the re-run (same function, same batch) skips the first
kind and applies the second. Every update of every variable then happens
exactly once per scheduled function: weights, optimizer slots, Keras's
metric and step counters, and any `tf.Variable` a layer updates, when the
update is traced in the step itself or a `cond` branch of it (an update
in a loop body or a nested `tf.function`, traced once and run many times,
runs ungated, with a warning). (The
additive form has no branch: an If op per update cost 23% of steps/s on a
small model under Keras 3, the zeroed delta 10%; with the slot and base
computed once per ps and a `scatter_nd_max` record, 6 ops per update, the
cost is below the benchmark's run-to-run spread; benchmarks/RESULTS.md.)

Tested: workers killed in the middle of a step, after part of its updates
reached the ps (tests/integration/parameter_server_fault_test.py): each
update applied once, in async and sync mode (without the gate, fit counted
65 optimizer steps of 64 in every run).

Limits. The re-run computes the updates it still applies from the
parameters it reads then (as any asynchronous step does). An update
whose write has run when its step's partition on the ps is aborted
(another input of that step failed to arrive from the dead worker) can
stop before its record; that one update is then applied again (seen: 1
run in 5 of the test above killing two workers mid-step at once, with
steps of both in flight, when every update was an If op; none with one
step in flight). Two attempts of
one function running at the same time (TF re-queued it while its first
attempt still ran) may both apply an update. Fused update kernels that
write a variable's handle directly (tf-keras's legacy optimizers,
`tf.raw_ops.ResourceApply*`) bypass the gate.

Inside a recorded function a gated update returns a scalar bool tensor
(True when applied) to depend on, not the variable's new value.
Outside one (eagerly, in custom loops on TF's own `ClusterCoordinator`
path) updates run as TF's do.

Ledger memory: one int64 vector of `step_ledger.SIZE` (32 KiB) per updated
variable (per shard of a split one), next to it on its ps task.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist._internal import attributes
from tfdist.parameter_server import step_ledger

__all__ = ["UpdateGate"]

#: Updates of one variable in one function, at most (the ledger entry is
#: `ticket * _STRIDE + updates applied`).
_STRIDE = 1 << 20

#: `tf.Variable` methods that write the variable.
_UPDATES = (
    "assign",
    "assign_add",
    "assign_sub",
    "scatter_add",
    "scatter_sub",
    "scatter_update",
    "scatter_max",
    "scatter_min",
    "scatter_mul",
    "scatter_div",
    "scatter_nd_add",
    "scatter_nd_sub",
    "scatter_nd_update",
    "scatter_nd_max",
    "scatter_nd_min",
    "batch_scatter_update",
)

def _gated_class(cls: type, gate: UpdateGate) -> type:
    """`cls` with every update method going through `gate`."""

    def through_gate(name: str) -> Callable[..., Any]:
        base = getattr(cls, name)

        def update(variable: Any, *args: Any, **kwargs: Any) -> Any:
            return gate.apply(variable, name, lambda *a: base(variable, *a, **kwargs), args)

        update.__name__ = name
        update.__doc__ = base.__doc__
        return update

    methods = {name: through_gate(name) for name in _UPDATES if hasattr(cls, name)}
    return type(cls.__name__, (cls,), methods)


#: Additive update methods: the position of their delta argument.
_ADDITIVE = {
    "assign_add": 0,
    "assign_sub": 0,
    "scatter_add": 0,
    "scatter_sub": 0,
    "scatter_nd_add": 1,
    "scatter_nd_sub": 1,
}


def _masked(delta: Any, applied: tf.Tensor, dtype: tf.DType) -> Any:
    """`delta`, or zeros where `applied` (dense or `IndexedSlices`; an Inf or NaN delta too)."""

    def zeroed(values: Any) -> tf.Tensor:
        return tf.where(applied, tf.zeros([], dtype), tf.convert_to_tensor(values, dtype))

    if isinstance(delta, tf.IndexedSlices):
        return tf.IndexedSlices(zeroed(delta.values), delta.indices, delta.dense_shape)
    return zeroed(delta)


def _outer_graphs(graph: Any) -> Iterator[Any]:
    """`graph`'s enclosing graphs, innermost first."""
    graph = getattr(graph, "outer_graph", None)
    while graph is not None:
        yield graph
        graph = getattr(graph, "outer_graph", None)


def _op_of(written: Any) -> Any:
    """What to wait for after an update: its op (a graph tensor, or a variable's last write)."""
    op = getattr(written, "op", None)
    return op if op is not None else written


class _Trace:
    """A recorded function being traced: its ticket, and the updates traced so far."""

    def __init__(self, ticket: tf.Tensor) -> None:
        self.ticket = ticket
        self.updates: dict[int, int] = {}
        self._keys: dict[tuple[int, str], tuple[tf.Tensor, tf.Tensor, tf.Tensor]] = {}

    def keys_on(self, device: str) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(slot, base, base as a vector) of the ticket, computed once per device and graph.

        `slot` indexes the ledgers (`ticket % SIZE`); `base` is
        `ticket * _STRIDE`, the entry of the ticket with no update applied.
        Made in the graph being built (a `cond` branch has its own: its
        tensors cannot be used outside it), on `device`: only the ticket
        travels there.
        """
        graph = tf.compat.v1.get_default_graph()
        key = (id(graph), device)
        if key not in self._keys:
            with tf.device(device):
                base = self.ticket * _STRIDE
                self._keys[key] = (
                    self.ticket % step_ledger.SIZE, base, tf.reshape(base, [1])
                )
        return self._keys[key]


class UpdateGate:
    """Gated updates of the variables of one strategy (see module).

    Contract: `adopt` is called by the strategy's variable creator for every
    variable it creates (on the creating thread), with a way to make the
    variable's ledger next to it; `tracing` by the step ledger around the
    body of every function it records. Gated updates outside `tracing` run
    ungated.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # By the graph of the function being traced: Keras's step runs in
        # TF's replica threads, inside that graph (or a branch of it).
        self._traces: dict[int, tuple[Any, _Trace]] = {}
        # `applying`: inside a gated update; `passing_over`: adopt nothing.
        self._local = threading.local()
        self._classes: dict[type, type] = {}
        # Ledgers by adopted variable's id (dropped when the variable is).
        self._ledgers: dict[int, tf.Variable] = {}
        self._warned_ungated = False

    def adopt(
        self, variable: tf.Variable, make_ledger: Callable[[int], tf.Variable]
    ) -> tf.Variable:
        """Sends `variable`'s updates through this gate; returns it.

        Args:
          variable: A `tf.Variable` just created (its class becomes a gated
            subclass of its own).
          make_ledger: Makes, in the context `variable` was made in, a whole
            int64 variable of the given number of zeros on `variable`'s
            device, outside any strategy (not tracked, not checkpointed).
        """
        if getattr(self._local, "passing_over", False):
            return variable
        with self._lock:
            if id(variable) in self._ledgers:
                return variable
            cls = type(variable)
            if cls not in self._classes:
                self._classes[cls] = _gated_class(cls, self)
        ledger = make_ledger(step_ledger.SIZE)
        with self._lock:
            self._ledgers[id(variable)] = ledger
            attributes.swap_class(variable, self._classes[cls])
        weakref.finalize(variable, self._forget, id(variable))
        return variable

    @contextlib.contextmanager
    def passing_over(self) -> Iterator[None]:
        """Variables created inside, on this thread, are not adopted: their updates run ungated.

        For tfdist's own bookkeeping variables (the step ledger), which
        need no ledger of their own.
        """
        with attributes.swapped(self._local, "passing_over", True):
            yield

    def adopted(self, variable: tf.Variable) -> bool:
        """Whether `variable`'s updates go through this gate."""
        with self._lock:
            return id(variable) in self._ledgers

    def _forget(self, key: int) -> None:
        with self._lock:
            self._ledgers.pop(key, None)

    @contextlib.contextmanager
    def tracing(self, ticket: tf.Tensor) -> Iterator[None]:
        """Gates the updates traced inside by `ticket` (a traced int64 scalar of this graph)."""
        graph = tf.compat.v1.get_default_graph()
        with self._lock:
            self._traces[id(graph)] = (graph, _Trace(ticket))
        try:
            yield
        finally:
            with self._lock:
                del self._traces[id(graph)]

    def _trace(self) -> _Trace | None:
        """The trace of the graph being built, if gating applies there.

        The recorded function's own graph, or a `cond` branch in it (run at
        most once per call). Not a loop body or a nested `tf.function`: traced
        once and run any number of times, their updates would share one
        index, and all but the first would be taken for applied; those run
        ungated (logged once).
        """
        graph: Any = tf.compat.v1.get_default_graph()
        with self._lock:
            while graph is not None:
                found = self._traces.get(id(graph))
                if found is not None:
                    return found[1]
                if type(graph).__name__ != "CondBranchFuncGraph":
                    break
                graph = getattr(graph, "outer_graph", None)
            inside_recorded = any(
                id(outer) in self._traces for outer in _outer_graphs(graph)
            )
        if inside_recorded and not self._warned_ungated:
            self._warned_ungated = True
            logging.warning(
                "tfdist: a variable update inside a loop body or nested "
                "tf.function of a parameter-server step is not gated: a step "
                "re-run after its worker failed mid-step may apply it again "
                "(see tfdist.parameter_server.update_gate)."
            )
        return None

    def apply(
        self,
        variable: tf.Variable,
        method: str,
        update: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> Any:
        """Runs `update(*args)`, `variable`'s `method`, gated by the ticket being traced (see module)."""
        if getattr(self._local, "applying", False) or not tf.inside_function():
            return update(*args)
        trace = self._trace()
        if trace is None:
            return update(*args)
        ledger = self.ledger(variable)
        index = trace.updates.get(id(variable), 0)
        trace.updates[id(variable)] = index + 1
        slot, base, base_vector = trace.keys_on(variable.device)
        with tf.device(variable.device):
            # Entries are ticket * _STRIDE + updates applied, and an older
            # ticket's entry is below `base`: applied iff above base + index.
            seen = tf.gather(ledger, slot)
            applied = tf.greater(seen, base + index if index else base)
            slot_index = tf.reshape(slot, [1, 1])
            delta_at = _ADDITIVE.get(method)
            if delta_at is not None and len(args) > delta_at:
                # An additive update: a zero delta when applied, then the
                # record (no branch; the record waits for the write, and
                # max() keeps an entry already past this update).
                masked = list(args)
                masked[delta_at] = _masked(args[delta_at], applied, variable.dtype)
                self._local.applying = True
                try:
                    written = update(*masked)
                finally:
                    self._local.applying = False
                with tf.control_dependencies([_op_of(written)]):
                    mark = ledger.scatter_nd_max(slot_index, base_vector + (index + 1))
                with tf.control_dependencies([mark]):
                    return tf.logical_not(applied)

            def run() -> tf.Tensor:
                graph = tf.compat.v1.get_default_graph()
                before = len(graph.get_operations())
                self._local.applying = True
                try:
                    update(*args)
                finally:
                    self._local.applying = False
                effects = [
                    op for op in graph.get_operations()[before:] if step_ledger.is_stateful(op)
                ]
                with tf.control_dependencies(effects):
                    mark = ledger.scatter_nd_max(slot_index, base_vector + (index + 1))
                with tf.control_dependencies([mark]):
                    return tf.identity(tf.constant(True))

            return tf.cond(applied, lambda: tf.constant(False), run)

    def ledger(self, variable: tf.Variable) -> tf.Variable:
        """The ledger of an adopted variable (on its device)."""
        with self._lock:
            return self._ledgers[id(variable)]

    def applied(self, variable: tf.Variable, ticket: int) -> int:
        """How many of `variable`'s updates in the function of `ticket` were applied (reads its ps)."""
        seen = int(tf.gather(self.ledger(variable), ticket % step_ledger.SIZE).numpy())
        return seen % _STRIDE if seen // _STRIDE == ticket else 0
