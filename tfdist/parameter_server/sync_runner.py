"""Synchronous steps: every worker's gradients of a step summed, applied once.

For each batch Keras's loop reads (the global batch, as on one device):

    split the batch into W' = min(num_workers, batch size) slices of
        sizes n_1..n_W' (as equal as possible, in order)
    phase 1, on W' workers at once (one function each):
        Keras's train_step on slice i, with the optimizer's
        apply_gradients (and Keras 3's apply, which a custom train_step
        may call instead) replaced (while tracing) by
            acc[v] += n_i * gradient_i(v)     # atomic, on v's ps task
            (a sparse gradient: rows_i[v] := n_i * its rows, with their
            indices; slice i's own buffers, on a ps task)
        (metrics update as usual: their variables live on the ps tasks)
    wait for every slice                        # the step barrier
    phase 2, on one worker:
        optimizer.apply_gradients((acc[v] / N, v) for every v)   # N = sum n_i
            (a sparse one: the rows of every rows_i[v], / N)
        acc[v] = 0; rows_i[v] = no rows
        read the metrics (the step's logs: each slice's own logs were
            read when it ended, maybe before another slice's updates)
    wait                                       # the next step reads new weights

`gradient_i` is the gradient of slice i's mean loss, so `sum n_i g_i / N`
is the gradient of the global batch's mean loss (plus the regularisation
terms once): the update one device makes with the same global batch, up
to float rounding. Sparse gradients (a lookup's `IndexedSlices`) are not
summed but kept as rows, per slice, on the ps tasks (`row_buffers`): the
optimizer receives the rows one device's gradient has, which Keras 3's
Adam, Adagrad and RMSprop need (they square each row before adding those
of one index). Not equal to one device: layers whose forward pass depends
on the whole batch (BatchNormalization's batch statistics) or on random
draws (Dropout). Losses must be means over the batch (Keras's default
reduction, "sum_over_batch_size").

Evaluation and prediction run as in async mode (they update no weights).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist._internal import attributes
from tfdist._internal import keras_ps
from tfdist.parameter_server import async_runner
from tfdist.parameter_server import row_buffers
from tfdist.parameter_server import scheduler as scheduler_lib
from tfdist.parameter_server import update_gate

__all__ = ["SyncRunner", "split_batch"]

# Steps whose metrics read after the barrier are kept for their logs.
_METRICS_KEPT = 4


def _first_leaf(batch: Any) -> Any:
    """The first tensor of a nested batch (its leading dimension is the batch size)."""
    return next(leaf for leaf in tf.nest.flatten(batch) if leaf is not None)


def split_batch(batch: Any, parts: int) -> list[Any]:
    """`batch` (a nest of tensors with one leading batch size) cut into up to `parts` slices.

    Slices are contiguous, in order, sizes as equal as possible (the first
    `n % parts` one larger); never empty (fewer slices when n < parts).
    """
    size = int(_first_leaf(batch).shape[0])
    count = max(1, min(parts, size))
    base, extra = divmod(size, count)
    slices = []
    start = 0
    for index in range(count):
        end = start + base + (1 if index < extra else 0)
        slices.append(
            tf.nest.map_structure(
                lambda leaf, s=start, e=end: None if leaf is None else leaf[s:e], batch
            )
        )
        start = end
    return slices


class _SyncTrainFunction:
    """What `SyncRunner.compile("train")` returns; traced per input structure."""

    def __init__(self, runner: SyncRunner, model: Any, keras3: bool) -> None:
        self._runner = runner
        self._model = model
        self._keras3 = keras3
        strategy = runner.strategy
        # Made before the first trace (`_create_accumulators`): a tf-keras
        # model may have no variables until its first call.
        self._variables: list[Any] = []
        self._accumulators: list[Any] = []
        by_id: dict[int, Any] = {}
        self._by_id = by_id
        rows = row_buffers.RowBuffers(runner.num_workers)
        self._rows = rows

        def accumulate(grads_and_vars: Any, *args: Any, **kwargs: Any) -> None:
            del args, kwargs
            for gradient, variable in grads_and_vars:
                if gradient is None:
                    continue
                if row_buffers.keeps_rows(gradient) and rows.write(
                    self._slice_index, variable, gradient, self._slice_size
                ):
                    continue
                target = by_id[id(variable)]
                gradient = tf.convert_to_tensor(gradient)
                target.assign_add(gradient * tf.cast(self._slice_size, gradient.dtype))

        def accumulate_apply(grads: Any, trainable_variables: Any = None) -> None:
            # Keras 3's `apply(grads, trainable_variables=None)`: None means
            # the variables the optimizer was built on, the model's.
            if trainable_variables is None:
                trainable_variables = self._variables
            accumulate(zip(grads, trainable_variables))

        step_fn = model.train_step
        optimizer = model.optimizer
        # Only while tracing, the ways a train_step applies gradients:
        # tf-keras's apply_gradients (minimize calls it too); Keras 3's
        # apply, which its apply_gradients calls and which a custom
        # train_step may call itself (keras-io's "customizing fit" guide).
        replacements: dict[str, Callable[..., None]] = {"apply_gradients": accumulate}
        if keras3:
            replacements["apply"] = accumulate_apply

        def slice_step(batch: Any) -> Any:
            self._slice_size = tf.shape(_first_leaf(batch))[0]
            with attributes.instance_attributes(optimizer, replacements):
                return step_fn(batch)

        def slice_function(slice_index: int) -> Any:
            def gradients(batches: tuple[Any, ...]) -> Any:
                (batch,) = batches
                self._slice_index = slice_index  # Read while tracing (row buffers).
                return strategy.run(slice_step, args=(batch,))

            # Recorded: a slice that finished is never applied twice.
            return runner.ledger.function(gradients, autograph=not keras3)

        def apply_once(scale: tf.Tensor) -> Any:
            def apply_fn(scale: tf.Tensor) -> Any:
                grads = [
                    rows.gradient(v, scale)
                    if rows.has(v)
                    else tf.convert_to_tensor(a) * tf.cast(scale, a.dtype)
                    for v, a in zip(self._variables, self._accumulators)
                ]
                optimizer.apply_gradients(zip(grads, self._variables))
                keras_ps.increment_step_counter(model, "train", 1)
                # Every slice's metric updates have landed (the barrier): the
                # metrics as one device reads them after the whole batch.
                return model.get_metrics_result()

            metrics = strategy.run(apply_fn, args=(scale,))
            for v, accumulator in zip(self._variables, self._accumulators):
                if not rows.has(v):
                    accumulator.assign(tf.zeros_like(accumulator))
            rows.clear()
            return metrics

        self._slice_function = slice_function
        self._slice_functions: list[Any] = []
        self._apply = runner.ledger.function(apply_once, autograph=not keras3)
        self._apply_concrete: Any = None

    def _create_accumulators(self, batch_spec: Any) -> None:
        """One accumulator per trainable variable (split like it); builds an unbuilt model first."""
        model = self._model
        if not model.built:  # A subclassed tf-keras model: one row of zeros builds it.
            x_spec = tf.keras.utils.unpack_x_y_sample_weight(batch_spec)[0]
            zeros = tf.nest.map_structure(
                lambda spec: tf.zeros([1, *spec.shape[1:]], spec.dtype), x_spec
            )
            with self._runner.strategy.scope():
                model(zeros)
        self._variables = list(model.trainable_variables)
        with self._runner.strategy.scope():
            self._accumulators = [
                tf.Variable(
                    tf.zeros(variable.shape, variable.dtype),
                    trainable=False,
                    name="tfdist_sync_gradient",
                )
                for variable in self._variables
            ]
        self._by_id.update((id(v), a) for v, a in zip(self._variables, self._accumulators))

    def _traced_slice(self, index: int, spec: tuple[Any, ...]) -> Any:
        while len(self._slice_functions) <= index:
            self._slice_functions.append(self._slice_function(len(self._slice_functions)))
        return self._slice_functions[index].get_concrete_function(spec)

    def get_concrete_function(self, specs: tuple[Any, ...]) -> _SyncSteps:
        """The step for batches of `specs[0]`: one traced function per slice, and the apply.

        A trace that meets sparse gradients without row buffers makes them
        and traces again (`row_buffers`); the apply is traced after, once
        (again if buffers were added since). Steps returned before stay
        consistent: their slices and apply accumulate as they were traced.
        """
        if not self._variables:
            self._create_accumulators(specs[0])
        spec = (specs[0],)
        first = self._traced_slice(0, spec)
        if self._rows.create(self._runner.strategy):
            self._slice_functions = []
            self._apply_concrete = None
            first = self._traced_slice(0, spec)
        slices = [first]
        for index in range(1, self._runner.num_workers):
            # Each slice writes row buffers of its own; without any, one trace serves all.
            slices.append(self._traced_slice(index, spec) if self._rows else first)
        if self._apply_concrete is None:
            self._apply_concrete = self._apply.get_concrete_function(
                tf.TensorSpec([], tf.float32)
            )
        return _SyncSteps(slices, self._apply_concrete)


class _SyncSteps:
    """A traced synchronous step: a function per slice index, and the apply function."""

    def __init__(self, slices: list[Any], apply: Any) -> None:
        self.slices = slices
        self.apply = apply


def _read_again(logs: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """`logs` with each value `metrics` has under its key (also in nested dicts).

    A custom train_step may return `{m.name: m.result() for m in
    self.metrics}`, where Keras 3's compiled metrics give a nested dict
    (`{"compile_metrics": {"mae": ...}}`); `metrics` is flat.
    """
    return {
        key: _read_again(value, metrics) if isinstance(value, dict) else metrics.get(key, value)
        for key, value in logs.items()
    }


class SyncRunner:
    """Runs Keras's training steps synchronously over all workers (see module).

    Args:
      strategy: The parameter-server strategy.
      scheduler: Where the functions are queued.
      num_workers: Worker tasks (slices per global batch, at most).
      gate: The strategy's update gate (each recorded slice's and apply's
        updates applied once), or None.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        scheduler: scheduler_lib.StepScheduler,
        num_workers: int,
        gate: update_gate.UpdateGate | None = None,
    ) -> None:
        self.strategy = strategy
        # A training step is done when submit returns: its logs are read
        # at once (KerasLoop), the last step's in each epoch included.
        self.blocks_on_steps = True
        self._scheduler = scheduler
        self.num_workers = num_workers
        self._async = async_runner.AsyncRunner(strategy, scheduler, gate)
        self.ledger = self._async.ledger
        # Apply steps are never handed out as a step's logs; their metric
        # results replace those of the step's last slice (`result`).
        self._applies: set[scheduler_lib.Step] = set()
        self._metrics_after: dict[scheduler_lib.Step, scheduler_lib.Step] = {}

    def compile(self, kind: str, model: Any, keras3: bool) -> Any:
        if kind != "train":
            return self._async.compile(kind, model, keras3)
        return _SyncTrainFunction(self, model, keras3)

    def submit(
        self,
        function: Callable[[Any], Any],
        batches: tuple[Any, ...],
        steps_per_function: int,
        *,
        logs_wanted: bool = True,
    ) -> Any:
        # A sync step's logs come with its slices (kept: they are few).
        if not isinstance(function, _SyncSteps):
            return self._async.submit(
                function, batches, steps_per_function, logs_wanted=logs_wanted
            )
        last = applied = None
        with self.strategy.scope():
            for batch in batches:
                slices = split_batch(batch, self.num_workers)
                size = sum(int(_first_leaf(piece).shape[0]) for piece in slices)
                handles = [
                    self._scheduler.schedule(traced, ((piece,),))
                    for traced, piece in zip(function.slices, slices)
                ]
                for handle in handles:
                    self._scheduler.wait(handle)
                last = handles[-1]
                applied = self._scheduler.schedule(
                    function.apply, (tf.constant(1.0 / size, tf.float32),)
                )
                self._applies.add(applied)
                self._scheduler.wait(applied)
        if last is not None and applied is not None:
            self._metrics_after[last] = applied
            while len(self._metrics_after) > _METRICS_KEPT:  # Older logs are not asked for.
                del self._metrics_after[next(iter(self._metrics_after))]
        return last

    def result(self, handle: Any) -> Any:
        """The step's logs: its last slice's, with every metric read after all slices.

        Each slice returns its train_step's logs, read when that slice ended,
        possibly before another slice's metric updates landed; the apply
        that follows the step's barrier reads the metrics again, and its
        values replace the slice's for every key they share (a custom
        train_step's other keys stay the slice's).
        """
        logs = self._scheduler.result(handle)
        applied = self._metrics_after.get(handle)
        if applied is not None and isinstance(logs, dict):
            logs = _read_again(logs, self._scheduler.result(applied))
        return logs

    def finished(self) -> list[Any]:
        found = []
        for step in self._scheduler.finished():
            if step in self._applies:
                self._applies.discard(step)
            else:
                found.append(step)
        return found

    def wait_all(self) -> None:
        self._scheduler.wait_all()
