"""Keras's own train step with its update on the summed gradients, and one collective per step.

Two uses, one mechanism (`StepFusion`):

- **On several workers** (`MultiWorkerMirroredStrategy`), one cross-worker
  collective per step. As Keras writes a step, it reduces over the network
  twice or more: the optimizer sums the gradients over every replica;
  Keras 3 then averages each logged value (one collective, which tfdist
  already packs), and tf-keras sums each metric's state variables as its
  `result()` reads them (one collective per variable, two per metric) and
  then each logged result again. On a small step each cross-worker
  collective costs ~2 ms here whatever its size. Here the logs ride in the
  gradients' buckets (`logs_ride=True`).
- **In one process under Keras 3** (`MirroredStrategy`, when the optimizer
  clips gradients or is a LossScaleOptimizer): Keras 3 clips each
  replica's part of the gradient (and a LossScaleOptimizer checks each
  replica's part for finiteness, acting on the first replica's answer)
  before its own sum, which one device does to the whole gradient. Here
  only the update is moved after the sum (`logs_ride=False`); the logs are
  reduced as Keras writes them.

The steps:

    1. the step runs; the optimizer's update is held back
       (`keras_compat.gradient_updates_intercepted`); with `logs_ride`,
       under tf-keras each sum of a metric's sync-on-read variable that
       `result()` asks of `strategy.reduce` is noted (its per-replica
       values), in order, and answered with a stand-in;
    2. after the step, one `merge_call` sums the held gradients; with
       `logs_ride` the log values ride in the first float32 bucket
       (`HierarchicalAllReduce.batch_reduce_with_riders`): Keras 3's logged
       scalars, tf-keras's noted variables;
    3. the held update runs on the summed gradients, which the optimizer
       does not sum again (`keras_compat.gradient_aggregation_skipped`);
    4. with `logs_ride`, the logs: Keras 3's are the riders' sums over the
       replica count (the mean Keras's own reduce computes); tf-keras's
       metrics' `result()` is traced again (`get_metrics_result()`, what
       Keras's own `compute_metrics` returns) with each noted variable's
       read answered by its rider's sum (what the read would have reduced
       to). Keras's
       reduce of these logs after `run` then returns them as they are.

Why moving the update after the metrics changes nothing: Keras's own
`train_step` and `compute_metrics` compute the metrics from the step's
targets and predictions and the loss it reported, none of which an update
reads, and the update reads no metric. The optimizer's own steps before its sum (gradient
clipping, a LossScaleOptimizer's finiteness check) now see the summed
gradients, as on one device. The logged values are the same sums and
means, each taken once: exact, up to the order of float32 additions.

Applies to Keras's own `train_step` and `compute_metrics` (and tf-keras's
`get_metrics_result`) only: an override may read the weights or the
optimizer's state after the update (`keras_compat.computes_metrics_as_keras`),
with an optimizer; each strategy's `_train_step_fusion` decides. A metric
passed to `compile` that reads the optimizer (a logged learning rate) sees
it before the step's update. A step whose update the
optimizer was not asked for exactly once is not fused, at trace time: its
held updates are applied as Keras would, each with its own sum, and its
logs are reduced as Keras writes it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from tfdist._internal import input_values
from tfdist._internal import keras_compat
from tfdist.collectives import cross_device_ops

__all__ = ["StepFusion"]

#: `StepFusion.reduce`'s answer for a value it leaves to the strategy.
NOT_NOTED = object()
#: Variable dtypes whose values ride as float32 exactly (float64 and integer
#: metric states are reduced by the strategy, each in its own collective).
_EXACT_IN_FLOAT32 = (tf.float32, tf.float16, tf.bfloat16)


class StepFusion:
    """One Keras training step with its gradients and logs in one set of collectives.

    Contract: made by a strategy's `run` for Keras's own train step, in
    cross-replica context, once per trace. Enter `installed()` around
    `Strategy.run`, whose `fn` is `wrap(fn)`. Then `finish(outputs)` gives
    the logs and which of them are already reduced (None: Keras reduces
    them). Every worker traces the same step, so every worker issues the
    same collectives in the same order. An exception while tracing leaves
    the optimizer as it was (every replacement is undone on exit).

    Args:
      strategy: The tfdist strategy running the step. With `logs_ride`,
        its `cross_device_ops` must have `batch_reduce_with_riders` and its
        `reduce` must first ask `reduce` here while the step is traced
        (`DistributedInputMixin` does).
      step: Keras's train step (`keras_compat.keras_step`).
      logs_ride: Whether the logs travel with the gradients (step 4);
        otherwise Keras reduces them after `run`, as it writes the step.
    """

    #: `reduce`'s answer for a value it leaves to the strategy.
    NOT_NOTED = NOT_NOTED

    def __init__(self, strategy: Any, step: keras_compat.KerasStep, *, logs_ride: bool) -> None:
        self._strategy = strategy
        self._step = step
        self._logs_ride = logs_ride
        self._replica = threading.local()  # Each replica's step is traced in a thread.
        self._fused = True
        self._summed_applies = 0  # Replicas inside the update of summed gradients.
        self._log_leaves: list[int] = []
        # tf-keras's metric reads (cross-replica: in merge_call, one thread).
        self._noting = False
        self._noted: list[tuple[Any, Any, Any]] = []  # (variable, reduce_op, per-replica values)
        self._replay: dict[int, Any] | None = None  # id(variable) -> its reduced value

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """While Keras's step is traced: the optimizer's update is held."""
        optimizer = self._step.model.optimizer
        with keras_compat.gradient_updates_intercepted(
            optimizer, self._hold
        ), keras_compat.gradient_aggregation_skipped(optimizer, self._applying_summed):
            try:
                yield
            finally:
                self._noting, self._replay = False, None

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` (one replica's step), then the fused reduction, the update and the logs."""

        def fused(*args: Any, **kwargs: Any) -> Any:
            state = self._replica
            state.held = []
            logs = fn(*args, **kwargs)
            if len(state.held) != 1:
                return self._unfused(state, logs)
            grads, variables, apply = state.held[0]
            present = [g for g in grads if g is not None]
            riders = self._keras3_riders(logs)
            reduced, rider_sums = tf.distribute.get_replica_context().merge_call(
                self._reduce_with_riders, args=(present, riders)
            )
            reduced_iter = iter(reduced)
            summed = [None if g is None else next(reduced_iter) for g in grads]
            # Not per thread: a LossScaleOptimizer applies in replica threads
            # of its own (`call_for_each_replica` in its `merge_call`), and
            # TF runs one replica thread at a time.
            self._summed_applies += 1
            try:
                apply(summed, variables)
            finally:
                self._summed_applies -= 1
            if not self._logs_ride:
                return logs
            if self._step.keras3:
                n = tf.cast(self._strategy.num_replicas_in_sync, tf.float32)
                leaves = tf.nest.flatten(logs)
                for i, total in zip(self._log_leaves, rider_sums):
                    leaves[i] = total / n
                return tf.nest.pack_sequence_as(logs, leaves)
            # tf-keras: its results again, each noted read answered (`reduce`).
            return self._step.model.get_metrics_result() if self._noted else logs

        return fused

    def reduce(self, reduce_op: Any, value: Any, axis: Any) -> Any:
        """The strategy's `reduce` while the step is traced: tf-keras's metric reads.

        A sum of a sync-on-read variable asked after the update was held
        (a metric's `result()`) is noted and answered with a stand-in; once
        the riders are summed, reads of the same variables get their sums.
        Anything else: `NOT_NOTED` (the strategy reduces it itself).
        """
        if axis is not None or not _is_sync_on_read(value) or value.dtype not in _EXACT_IN_FLOAT32:
            return NOT_NOTED
        if self._replay is not None:
            return self._replay.get(id(value), NOT_NOTED)
        if not self._noting:
            return NOT_NOTED
        reads = [tf.convert_to_tensor(component) for component in value.values]
        self._noted.append((value, cross_device_ops.as_reduce_op(reduce_op), reads))
        return reads[0]  # A stand-in of the right dtype and shape; step 4 replaces it.

    def finish(self, outputs: Any) -> tuple[Any, list[Any] | None]:
        """(the step's logs, those already reduced over every replica; None: not fused).

        Each replica holds the same reduced logs (Keras 3's riders' means;
        tf-keras's results replayed from the noted reads, made in
        cross-replica context); the first local replica's stand for all.
        """
        if not self._fused or not self._logs_ride or not (self._step.keras3 or self._noted):
            return outputs, None  # tf-keras's logs made from no noted read: Keras reduces them.
        leaves = tf.nest.flatten(outputs)
        logged = self._log_leaves if self._step.keras3 else range(len(leaves))
        final = []
        for i in logged:
            if isinstance(leaves[i], tf.distribute.DistributedValues):
                leaves[i] = leaves[i].values[0]
            if tf.is_tensor(leaves[i]):
                final.append(leaves[i])
        return tf.nest.pack_sequence_as(outputs, leaves), final

    # -- inside the trace ----------------------------------------------------

    def _applying_summed(self) -> bool:
        return self._summed_applies > 0

    def _hold(self, grads: list[Any], variables: list[Any] | None, apply: Callable[..., Any]) -> Any:
        self._replica.held.append((grads, variables, apply))
        self._noting = self._logs_ride and not self._step.keras3
        return None

    def _keras3_riders(self, logs: Any) -> list[Any]:
        if not (self._logs_ride and self._step.keras3):
            return []
        leaves = tf.nest.flatten(logs)
        self._log_leaves = [i for i, leaf in enumerate(leaves) if _is_float32_scalar(leaf)]
        return [leaves[i] for i in self._log_leaves]

    # Not converted by autograph: tf-keras traces its step with autograph on,
    # and `merge_call` would convert this and every collective function it
    # reaches, module by module (~2.7 s at a 2-worker fit's first step). None
    # of them branches on a tensor.
    @tf.autograph.experimental.do_not_convert
    def _reduce_with_riders(self, strategy: Any, grads: list[Any], riders: list[Any]) -> Any:
        """Cross-replica: the one reduction (`merge_call` of every local replica)."""
        self._noting = False
        if not self._logs_ride:
            pairs = [(g, g) for g in grads]
            return strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs), []
        noted = [_per_replica_float32(reads) for _, _, reads in self._noted]
        reduced, sums = strategy.cross_device_ops.batch_reduce_with_riders(
            grads, list(riders) + noted
        )
        if self._noted:
            answers = {}
            for (variable, reduce_op, reads), total in zip(self._noted, sums[len(riders):]):
                total = tf.cast(_first(total), reads[0].dtype)
                if reduce_op == tf.distribute.ReduceOp.MEAN:
                    total = total / tf.cast(strategy.num_replicas_in_sync, total.dtype)
                answers[id(variable)] = total
            self._replay = answers
        return reduced, sums[: len(riders)]

    def _unfused(self, state: Any, logs: Any) -> Any:
        """Keras's own order: each held update applied with its own sum."""
        self._fused = False
        self._noting = False
        for grads, variables, apply in state.held:
            apply(grads, variables)
        if self._noted:  # Stand-ins were read: read the metrics again, reduced as TF does.
            return self._step.model.get_metrics_result()
        return logs


def _is_sync_on_read(value: Any) -> bool:
    return (
        isinstance(value, tf.distribute.DistributedValues)
        and isinstance(value, tf.Variable)
        and value.synchronization == tf.VariableSynchronization.ON_READ
    )


def _is_float32_scalar(leaf: Any) -> bool:
    return tf.is_tensor(leaf) and leaf.dtype == tf.float32 and leaf.shape.rank == 0


def _per_replica_float32(reads: list[tf.Tensor]) -> Any:
    values = [tf.cast(r, tf.float32) for r in reads]
    return values[0] if len(values) == 1 else input_values.per_replica(values)


def _first(value: Any) -> Any:
    return value.values[0] if isinstance(value, tf.distribute.DistributedValues) else value
