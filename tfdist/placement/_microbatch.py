"""A Keras step run once per microbatch: gradients accumulated, one update.

GPipe's microbatching inside Keras's own step. A global batch of B rows
is cut into M contiguous microbatches of b_m rows (sizes differ by at most
one; `tfdist.data.splitting.slice_bounds`), and the step runs on each:

    for m in 0..M-1:                         # independent dataflow chains:
        outputs_m = step(microbatch m)       # stage s works on microbatch m
                                             # while stage s+1 works on m-1
        (its optimizer update is intercepted: grads_m kept)
    apply(sum_m grads_m)                     # one update, on each variable's
                                             # own device
    train/test: the last outputs (metrics read after every update)
    predict: the outputs concatenated in order

Pipelines (pipeline x data). With P copies of the pipeline, microbatch m
runs on copy m // (M / P): each copy gets M / P contiguous microbatches,
and the summed gradients are applied once on the first copy, where the
variables live.

Exactness. Keras's loss is a per-batch mean, (1/b_m) sum_{i in m} l_i, so
the gradient of one device's batch loss is sum_m (b_m / B) grad(loss_m).
Keras's own `train_step` gets the factor b_m / B on the loss it
differentiates (`keras_compat.loss_factor`; a scalar, free), a user's
`train_step` on its gradients; the loss and metrics Keras reports are
accumulated per microbatch weighted by rows, which is the batch's. So
training equals one device with batch B to float32 rounding, for any B
and M, including a last partial batch; a batch with fewer than M rows
leaves microbatches empty, and they contribute nothing (Keras divides by
their zero row count with `divide_no_nan`). Layers that compute statistics
over the batch (BatchNormalization in training) see b_m rows instead of B:
"ghost batch normalization" with virtual batch b_m.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ContextManager

import tensorflow as tf

from tfdist import errors
from tfdist._internal import keras_compat
from tfdist.collectives import sparse_rows
from tfdist.data import row_weights
from tfdist.data import splitting

__all__ = ["MicrobatchedStep"]

# `Any` below: nests of tensors, as Keras passes them.
Nested = Any


class MicrobatchedStep:
    """`step` run on `num_microbatches` slices of its batch; see the module docstring.

    Call it where Keras would call its step, inside `strategy.run` (in
    replica context, eagerly or while tracing).

    Args:
      step: The step function, taking one batch (`model.train_step`, ...).
      keras_step: What Keras step it is (model, kind, built-in or not).
      num_microbatches: M >= 2, over all pipelines.
      num_pipelines: P, copies of the pipeline; the caller makes it divide M.
      on_pipeline: `on_pipeline(p)` is entered around each microbatch of
        pipeline p, and `on_pipeline(0)` around the one update; `None`
        (one pipeline): nothing.
    """

    def __init__(
        self,
        step: Callable[[Nested], Any],
        keras_step: keras_compat.KerasStep,
        num_microbatches: int,
        *,
        num_pipelines: int = 1,
        on_pipeline: Callable[[int], ContextManager[None]] | None = None,
    ) -> None:
        self._step = step
        self._keras_step = keras_step
        self._num_microbatches = num_microbatches
        self._per_pipeline = num_microbatches // num_pipelines
        self._on_pipeline = on_pipeline or (lambda index: contextlib.nullcontext())

    def __call__(self, data: Nested) -> Any:
        kind = self._keras_step.kind
        present = [t for t in tf.nest.flatten(data) if t is not None]
        rows = splitting.batch_rows(present)
        optimizer = getattr(self._keras_step.model, "optimizer", None)
        accumulator = _GradientAccumulator(
            self._num_microbatches,
            scale_gradients=not self._keras_step.builtin,
            update_scope=lambda: self._on_pipeline(0),
        )
        outputs = []
        with _training_hooks(kind, self._keras_step, optimizer, accumulator):
            for index in range(self._num_microbatches):
                start, size = splitting.slice_bounds(rows, index, self._num_microbatches)
                factor = row_weights.ratio(size, rows, tf.float32)
                accumulator.factor = factor
                with keras_compat.loss_factor(factor if kind == "train" else None), \
                        self._on_pipeline(index // self._per_pipeline):
                    outputs.append(self._step(splitting.take_rows(data, start, size)))
        accumulator.check_complete()
        if kind == "predict":
            return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *outputs)
        return outputs[-1]


def _training_hooks(
    kind: str,
    keras_step: keras_compat.KerasStep,
    optimizer: Any,
    accumulator: _GradientAccumulator,
) -> contextlib.ExitStack:
    """What a training step needs around its microbatches; nothing otherwise."""
    stack = contextlib.ExitStack()
    if kind == "train" and optimizer is not None:
        stack.enter_context(
            keras_compat.gradient_updates_intercepted(optimizer, accumulator.intercept)
        )
        if keras_step.builtin:
            stack.enter_context(keras_compat.gradients_scaled(keras_step.model))
    return stack


class _GradientAccumulator:
    """Keeps each microbatch's gradients; applies their sum at the last one."""

    def __init__(
        self,
        num_microbatches: int,
        *,
        scale_gradients: bool,
        update_scope: Callable[[], ContextManager[None]],
    ) -> None:
        self._num_microbatches = num_microbatches
        self._scale_gradients = scale_gradients
        self._update_scope = update_scope
        self._gradients: list[list[Any]] = []
        self._variables: list[Any] | None = None
        self.factor: tf.Tensor | None = None

    def intercept(
        self, grads: list[Any], variables: list[Any] | None, apply: Callable[..., Any]
    ) -> Any:
        if self._scale_gradients:
            grads = [_scaled(g, self.factor) for g in grads]
        self._gradients.append(grads)
        self._variables = variables
        if len(self._gradients) < self._num_microbatches:
            return None
        with self._update_scope():
            total = [_summed(parts) for parts in zip(*self._gradients)]
            return apply(total, self._variables)

    def check_complete(self) -> None:
        calls = len(self._gradients)
        if calls not in (0, self._num_microbatches):
            raise errors.PlacementError(
                f"the train_step applied gradients {calls} time(s) for "
                f"num_microbatches={self._num_microbatches}: microbatching "
                "needs exactly one optimizer update per train_step call (it "
                "runs train_step once per microbatch and applies the summed "
                "gradients once). Use num_microbatches=1 for this model, or "
                "apply the optimizer once per train_step."
            )


def _scaled(gradient: Any, factor: tf.Tensor | None) -> Any:
    if gradient is None or factor is None:
        return gradient
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            gradient.values * tf.cast(factor, gradient.values.dtype),
            gradient.indices,
            gradient.dense_shape,
        )
    return gradient * tf.cast(factor, gradient.dtype)


def _summed(parts: tuple[Any, ...]) -> Any:
    """The sum of one variable's microbatch gradients (None if it has none)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    if all(isinstance(p, tf.IndexedSlices) for p in present) and sparse_rows.rows_align(present):
        # The same constant indices in every microbatch (a position
        # embedding): one device has one row per index, summed.
        return sparse_rows.sum_aligned(present)
    if any(isinstance(p, tf.IndexedSlices) for p in present):
        # Rows of every microbatch, concatenated: an update with repeated
        # indices adds them, as one device's gradient of the whole batch.
        slices = [
            p if isinstance(p, tf.IndexedSlices) else _as_slices(p) for p in present
        ]
        return tf.IndexedSlices(
            tf.concat([s.values for s in slices], axis=0),
            tf.concat([tf.cast(s.indices, tf.int64) for s in slices], axis=0),
            slices[0].dense_shape,
        )
    return present[0] if len(present) == 1 else tf.add_n(present)


def _as_slices(dense: tf.Tensor) -> tf.IndexedSlices:
    rows = tf.shape(dense, out_type=tf.int64)[0]
    return tf.IndexedSlices(dense, tf.range(rows), tf.shape(dense, out_type=tf.int64))
