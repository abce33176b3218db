"""Shards an input pipeline over replicas: each example exactly once per epoch.

`shard` is what a `dataset_fn` for `strategy.distribute_datasets_from_function`
returns: the per-replica batches of one input pipeline, in the order the
strategy hands them to that pipeline's local replicas.

Shard assignment (element policy). N elements, global batch B, G replicas
in sync, P input pipelines of R = G / P local replicas, b = B / G::

    S = ceil(N / B) (pad) | N // B (drop) | N / B (error)
    order_e = permutation of 0..N-1 from (seed, epoch e)    # stateless
    position j of the epoch holds element order_e[j]
    step k, replica r, slot i  <-  position k*B + r*b + i   for k < N // B
    last step (pad): the M = N mod B tail positions are split over replicas
        as evenly as possible (replica r: M // G + (r < M mod G) of them);
        the rest of each per-replica batch is zeros with sample weight 0
    pipeline p yields, for each step k: replicas p*R .. p*R+R-1, in order
    sample weight (pad, normalize_padded_loss): B / M_k for every real
        example of step k, 0 for padding; M_k = real examples of step k
        over all replicas and pipelines (B for a full step)
    split: as pad, but the padding rows are removed; replica r's b_r real
        rows get sample weight G * b_r / M_k (1 in a full step)

Every pipeline computes `order_e` itself (same seed, same epoch, same
stateless op), so pipelines agree without communicating and the union of
their real examples is the dataset, each once. With the file policy each
pipeline reads whole files instead: the epoch's permuted file list is dealt
round robin to pipelines, each pipeline permutes its own records, and all
pipelines run the same number of steps (the largest shard's, padding the
others; or the smallest shard's with `remainder="drop"`). Exactly-once still
holds; a global per-example permutation does not. A step's M_k is then
the sum over pipelines of min(max(s_q - k * B / P, 0), B / P), from every
pipeline's shard size s_q in the epoch's deal, which every pipeline knows.

Why B / M_k. Keras reduces a weighted loss with "sum_over_batch_size":
each replica divides sum(w * loss) by its batch size b, padding included,
and the gradient is summed over G replicas after scaling by 1 / G, so the
step minimizes sum_all(w * loss) / B. With 0/1 weights a padded step's
gradient is M_k / B times the mean over its real examples, not that mean.
Weights B / M_k make sum_all(w * loss) / B = sum_real(loss) / M_k: the mean
over the step's real examples, as one device training on them computes.
With split, replica r divides by its b_r rows, so weights G * b_r / M_k
give sum_r (G * b_r / M_k) * sum_{i in r}(loss_i) / (b_r * G) = the same
mean. Every replica needs M_k of the whole step, not of its own batch (the tail
is spread over replicas, so some replicas' batches are full in a padded
step); it comes from the plan, not from any replica's mask.

How each policy reads its input is in `_element_policy` and
`_file_policy`; the weights of a short step are attached in `_remainder`.
(TF 2.21's own options do not fit: `global_shuffle` is private, needs
random-access inputs and draws each iteration's order from a seed
generator, so epoch e's order cannot be recomputed to resume; and
`tf.data.experimental.at` fetches one element per call, from random-access
datasets only.)

Epochs. The returned dataset counts its iterators in a host-local variable:
the i-th iterator to start producing (Keras 3 without `steps_per_epoch`
makes one per epoch) is epoch `epoch + i`, the first starting at global
step `start_step`, so `(epoch, start_step)` resumes an interrupted run with
the same remaining examples. Workers stay in step as long as each creates
the same number of iterators. Keras 3's `fit` also starts one iterator to
peek at a batch when the model or its compiled metrics are not built yet,
which takes epoch `epoch` (and `start_step`) for itself.

Keras `fit` over several epochs. tf-keras needs `steps_per_epoch` for any
distributed dataset, and then (like Keras 3 given `steps_per_epoch`) keeps
one iterator for all epochs; so return `shard(...).repeat()` from the
`dataset_fn` and pass `steps_per_epoch` (each pass of the repeat is the
next epoch). Keras 3 without `steps_per_epoch` starts an iterator per
epoch and reads the number of steps from the cardinality, which is known
only when each pipeline feeds one replica (see `shard`'s Returns); with
more local replicas it learns the epoch's length in epoch 1 and warns
there that the input ran out of data.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tfdist import errors
from tfdist import _validation as validation
from tfdist.data import _checks
from tfdist.data import _element_policy
from tfdist.data import _file_policy
from tfdist.data import _pipeline
from tfdist.data import _plan
from tfdist.data import _remainder
from tfdist.data import policies
from tfdist.data.policies import DEFAULT_MAX_IN_MEMORY_BYTES
from tfdist.data.policies import Remainder
from tfdist.data.policies import ShardPolicy

__all__ = [
    "DEFAULT_MAX_IN_MEMORY_BYTES",
    "Remainder",
    "ShardPolicy",
    "shard",
    "shard_steps",
]

# `Any` below: a nested structure (tuple/dict) of tensors, as tf.data yields.
Nested = Any


def shard(
    dataset: tf.data.Dataset | Sequence[str | os.PathLike[str]],
    input_context: tf.distribute.InputContext | None,
    *,
    global_batch_size: int,
    seed: int = 0,
    shuffle: bool = True,
    policy: ShardPolicy | str = ShardPolicy.AUTO,
    remainder: Remainder | str = Remainder.PAD,
    normalize_padded_loss: bool = True,
    epoch: int | None = None,
    start_step: int = 0,
    reshuffle_each_iteration: bool = True,
    parse_fn: Callable[..., Nested] | None = None,
    reader: Callable[[tf.Tensor], tf.data.Dataset] | None = None,
    max_in_memory_bytes: int = DEFAULT_MAX_IN_MEMORY_BYTES,
) -> tf.data.Dataset:
    """Returns one input pipeline's per-replica batches for a distributed run.

    Call it inside the `dataset_fn` of
    `strategy.distribute_datasets_from_function`, eagerly, once per input
    pipeline. Pipeline p, feeding R = num_replicas_in_sync /
    num_input_pipelines local replicas, yields for each global step the
    per-replica batches of replicas p*R .. p*R+R-1, in that order; each has
    exactly `per_replica_batch_size = global_batch_size /
    num_replicas_in_sync` rows. Over one epoch, the real examples of all
    pipelines are the input, each exactly once (minus the dropped tail with
    `remainder="drop"`).

    Elements must be dense tensors of one shape (per component). With
    `remainder="pad"` they must be Keras-style tuples `(x, y)` or
    `(x, y, sample_weight)`, and come out as `(x, y, sample_weight)`: 0.0
    for padding and, for a real example of global step k,
    `global_batch_size / M_k` (float32; 1.0 in every full step), where M_k
    is the number of real examples in step k over all replicas and input
    pipelines; a given weight is multiplied by that (integer weights
    become float32). With this, Keras's default loss reduction gives a
    padded step the mean loss over its real examples, as one device
    training on them would (see the module docstring). With
    `normalize_padded_loss=False` the weight is a 0/1 mask (times the given
    weight), and a padded step's gradient shrinks by M_k /
    `global_batch_size`. Padding examples are zeros shaped like real ones
    and occur only in an epoch's last global step (file policy: in the last
    steps of the pipelines with less data). Other remainders leave elements
    as they are, except `remainder="split"` (see `Remainder.SPLIT`): its
    last step gives each replica only real rows, so per-replica batches have
    at most `per_replica_batch_size` rows.

    Known limitations of `remainder="pad"` (training itself is exact; what
    Keras reports is not): Keras `weighted_metrics` count each real example of a padded step
    with weight `global_batch_size / M_k`, so over an epoch they weight
    that step's examples more than the others; Keras 3 unweighted `metrics`
    (`compile(metrics=...)`; tf-keras's too) ignore sample weights, so they
    count padding rows as examples, with either setting; and the epoch's
    mean `loss` that `fit` reports weights a padded step like a full one.
    Where exact metrics matter, use `remainder="split"` (unweighted
    metrics and `predict` then see only real rows).

    Args:
      dataset: A finite `tf.data.Dataset` of unbatched elements (an unknown
        cardinality is counted once, with one extra pass), or a sequence of
        file paths read with `reader` and `parse_fn`.
      input_context: The `tf.distribute.InputContext` the strategy passes;
        `None` means one pipeline feeding one replica.
      global_batch_size: Examples per global step, over all replicas; a
        multiple of `num_replicas_in_sync`.
      seed: Seed of every permutation (int64 range). Every worker must pass
        the same seed.
      shuffle: If false, keep the input order (files: their given order).
      policy: `"auto"`, `"file"` or `"element"`; see `ShardPolicy`.
      remainder: `"pad"`, `"split"`, `"drop"` or `"error"`; see `Remainder`.
      normalize_padded_loss: With `remainder="pad"`: if true (default), a
        real example of global step k gets sample weight
        `global_batch_size / M_k` instead of 1, so that a padded step
        trains on the mean loss of its M_k real examples (see above); if
        false, 0/1 weights. With `"split"`: the weights of
        `Remainder.SPLIT`, or 1 if false. Ignored with other remainders.
      epoch: Epoch number of the first iteration over the returned dataset;
        `None` means 0. With `reshuffle_each_iteration`, later iterations
        are the following epochs.
      start_step: Global step within `epoch` at which the first iteration
        starts (resumption); later iterations start at step 0.
      reshuffle_each_iteration: If true (default), each new iterator over
        the returned dataset is the next epoch, with a new permutation; this
        keeps one counter variable on the input host and needs eager
        execution. If false, every iteration replays `(epoch, start_step)`.
      parse_fn: File input only: maps one record to one element (used with
        `Dataset.map`); `None` keeps records as they are.
      reader: File input only: maps one file path (a string tensor) to a
        dataset of its records; default `tf.data.TFRecordDataset`.
      max_in_memory_bytes: Element policy: a dataset estimated no larger is
        read into memory once; a larger one is streamed and permuted in
        windows of about half this size. File policy: records are permuted
        in windows of about half this size.

    Returns:
      A `tf.data.Dataset` of per-replica batches. Its cardinality is the
      number of global steps for the element policy when the pipeline feeds
      one replica and every iteration has the same length (`start_step=0`
      or no reshuffling); otherwise unknown.

    Raises:
      TypeError: If an argument has the wrong type.
      ConfigError: If a value is invalid (message names it and the fix):
        batch size not divisible by `num_replicas_in_sync`, infinite or
        empty input, non-tuple elements with `remainder="pad"`, sizes that
        do not divide with `remainder="error"`, no full step with
        `remainder="drop"`, `policy="file"` with too few files or with a
        `tf.data.Dataset`, `start_step` past the epoch, or a call that is
        not eager.

    Example:
      >>> def dataset_fn(input_context):
      ...     return tfdist.data.shard(
      ...         dataset, input_context, global_batch_size=64, seed=0)
      >>> dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
    """
    validation.check_bool("normalize_padded_loss", normalize_padded_loss)
    batches, layout, remainder, _ = _real_row_batches(
        dataset,
        input_context,
        global_batch_size=global_batch_size,
        seed=seed,
        shuffle=shuffle,
        policy=policy,
        remainder=remainder,
        epoch=epoch,
        start_step=start_step,
        reshuffle_each_iteration=reshuffle_each_iteration,
        parse_fn=parse_fn,
        reader=reader,
        max_in_memory_bytes=max_in_memory_bytes,
    )
    return _remainder.finish(
        batches,
        remainder,
        layout=layout,
        normalize_padded_loss=normalize_padded_loss,
    )


def shard_steps(
    dataset: tf.data.Dataset,
    input_context: tf.distribute.InputContext | None,
    *,
    global_batch_size: int,
    seed: int = 0,
    shuffle: bool = True,
    remainder: Remainder | str = Remainder.SPLIT,
    epoch: int | None = None,
    start_step: int = 0,
    max_in_memory_bytes: int = DEFAULT_MAX_IN_MEMORY_BYTES,
) -> tf.data.Dataset:
    """`shard`'s element policy, one element per global step of this pipeline.

    For tfdist strategies, which hand a step's per-replica batches to their
    replicas together. Takes `shard`'s arguments (element policy;
    `remainder` "split" or "error") and yields, for each global step,
    `(batches, is_real, num_real)`: `batches` stacks the R local replicas'
    batches (leading dimensions R and `per_replica_batch_size`, padding rows
    included), `is_real` [R, per_replica_batch_size] marks the real rows
    and `num_real` [R] holds the step's real rows over all pipelines (the
    same value R times). No weights are added: the caller keeps each
    replica's real rows.

    Raises:
      As `shard`; ConfigError also for `remainder` "pad" or "drop".
    """
    value = remainder.value if isinstance(remainder, Remainder) else remainder
    if value in (Remainder.PAD.value, Remainder.DROP.value):
        raise errors.ConfigError(
            f"shard_steps takes remainder='split' or 'error'; received "
            f"remainder={value!r}. A strategy gives each replica the real "
            "rows of the last step (no padding rows, nothing dropped)."
        )
    batches, layout, _, steps = _real_row_batches(
        dataset,
        input_context,
        global_batch_size=global_batch_size,
        seed=seed,
        shuffle=shuffle,
        policy=ShardPolicy.ELEMENT,
        remainder=remainder,
        epoch=epoch,
        start_step=start_step,
        reshuffle_each_iteration=True,
        parse_fn=None,
        reader=None,
        max_in_memory_bytes=max_in_memory_bytes,
    )
    steps_of_replicas = batches.batch(layout.num_local_replicas, drop_remainder=True)
    if steps is not None:
        steps_of_replicas = steps_of_replicas.apply(
            tf.data.experimental.assert_cardinality(steps)
        )
    return steps_of_replicas.prefetch(tf.data.AUTOTUNE)


def _real_row_batches(
    dataset: tf.data.Dataset | Sequence[str | os.PathLike[str]],
    input_context: tf.distribute.InputContext | None,
    *,
    global_batch_size: int,
    seed: int,
    shuffle: bool,
    policy: ShardPolicy | str,
    remainder: Remainder | str,
    epoch: int | None,
    start_step: int,
    reshuffle_each_iteration: bool,
    parse_fn: Callable[..., Nested] | None,
    reader: Callable[[tf.Tensor], tf.data.Dataset] | None,
    max_in_memory_bytes: int,
) -> tuple[tf.data.Dataset, _plan.ReplicaLayout, Remainder, int | None]:
    """Validates `shard`'s arguments; per-replica `(batch, is_real, num_real)`.

    Also returns the layout, the remainder and, for the element policy, the
    global steps of every iteration (None if they differ or for files).
    """
    # Pure-Python checks, before anything touches the TF runtime.
    source = _checks.check_source(dataset)
    files = source if isinstance(source, tuple) else None
    layout = _checks.check_layout(input_context, global_batch_size)
    _checks.check_seed(seed)
    validation.check_bool("shuffle", shuffle)
    validation.check_bool("reshuffle_each_iteration", reshuffle_each_iteration)
    first_epoch = (
        0
        if epoch is None
        else validation.check_non_negative_int("epoch", epoch)
    )
    validation.check_non_negative_int("start_step", start_step)
    validation.check_positive_int("max_in_memory_bytes", max_in_memory_bytes)
    policy = ShardPolicy(
        validation.check_one_of(
            "policy", policies.enum_value(policy), [p.value for p in ShardPolicy]
        )
    )
    remainder = Remainder(
        validation.check_one_of(
            "remainder", policies.enum_value(remainder), [r.value for r in Remainder]
        )
    )
    read = _checks.check_file_options(files, parse_fn, reader)
    if files is None and policy is ShardPolicy.FILE:
        raise errors.ConfigError(
            "policy='file' needs file paths, but a tf.data.Dataset was "
            "passed. Pass the list of files with parse_fn (and reader), or "
            "use policy='element' (or 'auto')."
        )
    if files is not None and policy is ShardPolicy.FILE:
        _checks.check_enough_files(files, layout)
    if not tf.executing_eagerly():
        raise errors.ConfigError(
            "tfdist.data.shard must be called eagerly (it inspects the input "
            "once); it was called while building a graph, e.g. inside "
            "tf.function. Call it from the dataset_fn of "
            "strategy.distribute_datasets_from_function."
        )
    schedule = _pipeline.EpochSchedule(
        seed=seed,
        shuffle=shuffle,
        first_epoch=first_epoch,
        start_step=start_step,
        reshuffle_each_iteration=reshuffle_each_iteration,
    )
    if isinstance(source, tuple):
        batches = _file_policy.shard_files(
            source,
            layout,
            schedule,
            policy,
            remainder,
            read=read,
            parse_fn=parse_fn,
            max_in_memory_bytes=max_in_memory_bytes,
        )
    else:
        if policy is ShardPolicy.AUTO:
            logging.info(
                "tfdist.data.shard: policy='auto' chose 'element': the input "
                "is a tf.data.Dataset (pass file paths for the file policy)."
            )
        batches, steps = _element_policy.shard_elements(
            source,
            layout,
            schedule,
            remainder,
            max_in_memory_bytes,
        )
        return batches, layout, remainder, steps
    return batches, layout, remainder, None


