"""Exact training on uneven global batches: a per-replica factor on Keras's loss.

Keras reduces a replica's loss over its own rows ("sum_over_batch_size")
and scales it by 1 / G before the gradients are summed over the G replicas.
When a global batch of m rows splits unevenly (b_s rows for replica s, for
example an epoch's last partial batch, or every batch of a batch size
the replicas do not divide), that sum is not the mean over the m
rows that one device computes. Multiplying replica s's loss by
f_s = G * b_s / m makes it that mean:

    sum_s f_s * (1/G) * sum_{i in s} loss_i / b_s = sum_i loss_i / m

(and leaves regularization losses, which every replica adds scaled by
1 / G, whole: sum_s f_s / G = 1). Only the loss Keras differentiates is
multiplied (`keras_compat.gradients_scaled`), not the one it reports, so
the epoch's logged loss is the plain mean too; the data Keras sees is the
user's, unweighted. This is done where Keras's *own* `train_step` runs
(`strategy.run` inside `fit`); evaluation needs nothing (Keras weights each
replica's loss by its rows when it averages them), and `predict`, custom
loops and user-written `train_step`s get the plain slices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfdist import errors
from tfdist._internal import input_values
from tfdist._internal import keras_compat
from tfdist.data import row_weights
from tfdist.data import splitting

__all__ = ["check_training_batch", "with_exact_loss"]

# `Any` below: nests of tensors and per-replica values, as Keras passes them.
Nested = Any


def _first_input_value(data: Nested) -> input_values.InputPerReplica | None:
    for leaf in tf.nest.flatten(data):
        if input_values.is_input_value(leaf):
            return leaf
    return None


def check_training_batch(data: Nested, num_replicas_in_sync: int) -> None:
    """Raises ConfigError if `data`'s global batch size cannot be split evenly.

    Called when Keras's `fit` runs an overridden `train_step` on tfdist
    input: such a step reduces each replica's loss over its own rows, which
    is one device's mean only when every replica has as many rows. A last
    partial batch is let through (as TF's strategy does); the batch size the
    input was built with must divide. (Keras's own `train_step` needs no
    check: `with_exact_loss` weights it.)
    """
    value = _first_input_value(data)
    if value is None or value.nominal_batch_size is None:
        return
    batch_size = value.nominal_batch_size
    if batch_size % num_replicas_in_sync == 0:
        return
    lower = batch_size // num_replicas_in_sync * num_replicas_in_sync
    upper = lower + num_replicas_in_sync
    suggestions = f"{lower} or {upper}" if lower else f"{upper}"
    raise errors.ConfigError(
        f"training batch_size={batch_size} (the batch size of the data "
        f"given to fit) is not divisible by num_replicas_in_sync="
        f"{num_replicas_in_sync}, and the model overrides train_step, which "
        f"averages each replica's loss over its own rows: uneven slices would "
        f"train another model than one device. Use batch_size={suggestions} "
        f"(a multiple of {num_replicas_in_sync}), or Keras's own train_step "
        f"(exact for any batch size); evaluate and predict accept any batch size."
    )


def with_exact_loss(
    fn: Callable[..., Any], args: tuple[Any, ...], num_replicas_in_sync: int
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """Returns `(fn', args')`: `fn` with each replica's loss factor set.

    `args` must be Keras's `(data,)` with tfdist input values in `data`;
    anything else is returned unchanged. Run `fn'` inside
    `keras_compat.gradients_scaled(model)` so the factor reaches the loss.
    Must be called in cross-replica context (in `Strategy.run`, before
    TF's), eagerly or while tracing.
    """
    if len(args) != 1:
        return fn, args
    value = _first_input_value(args[0])
    if value is None:
        return fn, args
    global_rows = value.global_rows
    factors = input_values.InputPerReplica(
        [
            row_weights.ratio(
                num_replicas_in_sync * splitting.batch_rows(local),
                global_rows,
                tf.float32,
            )
            for local in value.values
        ],
        global_rows,
        value.nominal_batch_size,
    )

    def step_with_factor(data: Nested, factor: tf.Tensor) -> Any:
        with keras_compat.loss_factor(factor):
            return fn(data)

    return step_with_factor, (args[0], factors)
