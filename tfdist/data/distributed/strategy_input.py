"""The input half every tfdist strategy shares: datasets in, per-replica values out.

`DistributedInputMixin` goes first in a strategy's bases, before the TF
strategy class it extends. It gives the strategy:

- `experimental_distribute_dataset`: tfdist's input path
  (`tfdist/data/distributed/`): one pipeline per worker, each global batch cut into
  per-replica slices, elements shaped as the user's dataset;
- `run`: for Keras 3's `predict_on_batch`, the batch cut over the
  replicas (Keras gives each replica all of it and returns every row
  once per replica); for `fit`'s steps, the training
  batch-size check and, for
  Keras's own `train_step`, the per-replica loss factor that makes an
  uneven batch train exactly like one device, with the logged loss exact
  too (`tfdist/data/distributed/train_weights.py`);
- `reduce` of input values with `axis=None` (what Keras 3 asks for
  before training, to build the model from one batch): this worker's rows
  of the batch, without a collective. An element-wise mean across
  replicas of different examples means nothing, and cannot be taken when
  the slices have different numbers of rows.

A strategy using it implements `_input_layout()` and has a
`shard_options` property.
"""

from __future__ import annotations

import weakref
from typing import Any

import tensorflow as tf

from tfdist._internal import attributes
from tfdist._internal import input_values
from tfdist._internal import keras_compat
from tfdist.data import options as data_options
from tfdist.data.distributed import data_service
from tfdist.data.distributed import distribute
from tfdist.data.distributed import split
from tfdist.data.distributed import train_weights

__all__ = ["DistributedInputMixin", "check_shard_options"]


def check_shard_options(value: object) -> data_options.ShardOptions | None:
    """Returns `value` if it is a `ShardOptions` or None; else TypeError."""
    if value is not None and not isinstance(value, data_options.ShardOptions):
        raise TypeError(
            "shard_options must be a tfdist.data.ShardOptions or None; "
            f"received shard_options={value!r} of type {type(value).__name__}."
        )
    return value


class DistributedInputMixin:
    """tfdist's dataset distribution for a `tf.distribute.Strategy` subclass."""

    # Provided by the tf.distribute.Strategy this mixin is combined with.
    num_replicas_in_sync: int

    @property
    def shard_options(self) -> data_options.ShardOptions | None:
        """How plain datasets are sharded (`None`: split each batch)."""
        raise NotImplementedError

    def _input_layout(self) -> split.InputLayout:
        """This worker's replicas among all replicas in sync."""
        raise NotImplementedError

    def _chief_input_service(self) -> data_service.ChiefInputService | None:
        """The service that serves pipelines only the chief may run (multi-worker)."""
        return None

    def experimental_distribute_dataset(
        self, dataset: tf.data.Dataset, options: tf.distribute.InputOptions | None = None
    ) -> tf.distribute.DistributedDataset:
        """Distributes a batched `dataset`: each global batch over all replicas.

        One input pipeline per worker feeds all of its replicas (so any
        pipeline, random or not, gives every example exactly once per
        epoch); each global batch of B rows is cut into per-replica slices
        of B / num_replicas_in_sync rows (a last partial batch as evenly as
        possible, some slices possibly empty). Elements have the structure
        of `dataset`'s, each leaf a `PerReplica` as in TF. With
        `shard_options`, the dataset is sharded by `tfdist.data.shard`.

        Args:
          dataset: A batched `tf.data.Dataset` (dense or ragged tensors).
          options: TF's `tf.distribute.InputOptions`; accepted for
            compatibility (replicas read on the host), except
            `InputReplicationMode.PER_REPLICA`, refused as by TF.

        Raises:
          TypeError: If `dataset` is not a `tf.data.Dataset`.
          ConfigError: If its elements are not batches (see message).
        """
        return distribute.distribute_dataset(
            dataset,
            self._input_layout(),
            shard_options=self.shard_options,
            input_options=options,
            chief_service=self._chief_input_service(),
        )

    def distribute_datasets_from_function(
        self,
        dataset_fn: Any,
        options: tf.distribute.InputOptions | None = None,
    ) -> tf.distribute.DistributedDataset:
        """TF's `distribute_datasets_from_function`, with workers that agree.

        `dataset_fn(input_context)` builds one worker's pipeline, as in TF.
        With several workers, a pipeline that shuffles before taking its
        shard (`Dataset.shard`) would give each worker a different shard of
        a differently ordered copy; tfdist gives such shuffles a seed every
        worker shares, and refuses (`ConfigError`) other differences that
        feed a shard (see `tfdist/data/distributed/distribute.py`).
        """
        service = self._chief_input_service()
        if service is not None:
            dataset_fn = distribute.agreeing_dataset_fn(dataset_fn, service)
        return super().distribute_datasets_from_function(  # type: ignore[misc]
            dataset_fn, options
        )

    def run(
        self,
        fn: Any,
        args: Any = (),
        kwargs: Any = None,
        options: tf.distribute.RunOptions | None = None,
    ) -> Any:
        """`tf.distribute.Strategy.run`, with exact losses for Keras's `fit`.

        Runs `fn` on every replica as TF does. When `fn` is a training step
        of Keras's `fit` (Keras 3 or tf-keras) on tfdist input, Keras's own
        `train_step` gets a loss factor per replica, so that any global
        batch (one the replicas do not divide included) trains as on one
        device (see `tfdist/data/distributed/train_weights.py`); an overridden
        `train_step` gets plain slices, and a batch size the replicas do not
        divide raises `ConfigError` first.
        """
        step = keras_compat.keras_step(fn)
        if step is None or kwargs:
            return super().run(fn, args, kwargs, options)  # type: ignore[misc]
        args = tuple(args)
        if step.kind == "predict" and len(args) == 1 and not _has_distributed_values(args[0]):
            # Keras 3's predict_on_batch gives every replica the whole batch
            # and concatenates their outputs: each row came back once per
            # replica. Cut it like a distributed dataset's batch instead.
            # (train_on_batch and test_on_batch are right as Keras does
            # them: each replica's mean over the same rows, averaged.)
            args = (split.split_batch(args[0], self._input_layout(), None),)
        if step.kind == "train" and not step.builtin:
            train_weights.check_training_batch(args, self.num_replicas_in_sync)
        if step.kind == "train" and step.builtin:
            fn, args = train_weights.with_exact_loss(fn, args, self.num_replicas_in_sync)
            fusion = self._train_step_fusion(step)
            if fusion is not None:
                with keras_compat.gradients_scaled(step.model), fusion.installed(), attributes.swapped(
                    self, "_fusion_tracing", fusion
                ):
                    outputs = super().run(fusion.wrap(fn), args, kwargs, options)  # type: ignore[misc]
                outputs, final = fusion.finish(outputs)
                if final is None:  # Not fused after all: reduced as Keras writes it.
                    return self._logs_reduced(step, outputs)
                for leaf in final:
                    # Keras 3's are means; tf-keras's are results every replica
                    # holds, which its reduce sums.
                    self._mark_final(leaf, for_sum=not step.keras3)
                return outputs
            with keras_compat.gradients_scaled(step.model):
                outputs = super().run(fn, args, kwargs, options)  # type: ignore[misc]
        else:
            outputs = super().run(fn, args, kwargs, options)  # type: ignore[misc]
        return self._logs_reduced(step, outputs)

    def _logs_reduced(self, step: keras_compat.KerasStep, outputs: Any) -> Any:
        if step.keras3 and step.kind != "predict" and self._input_layout().num_workers > 1:
            # Keras 3 then averages each logged value over the replicas with
            # its own cross-worker collective; one collective does them all,
            # and Keras's reduce of the plain means needs none.
            outputs = self._mean_of_scalars_at_once(outputs)
        return outputs

    def _train_step_fusion(self, step: keras_compat.KerasStep) -> Any:
        """A strategy's way to reduce Keras's own train step in fewer collectives, or None.

        Returns an object with `installed()` (a context entered around
        `Strategy.run`), `wrap(fn)` and `finish(outputs) -> (outputs, the
        logged values already reduced, or None when the step was not
        fused)`; see `tfdist/collectives/fused_step.py`.
        """
        return None

    def _mean_of_scalars_at_once(self, outputs: Any) -> Any:
        """`outputs` with its float32 scalars averaged over all replicas by one reduce.

        A worker with one replica gets plain tensors from `run` (which TF's
        multi-worker `reduce` still averages across workers); several give
        per-replica values. The means are remembered, so that Keras's
        `reduce(MEAN, mean)` right after returns them without a collective.
        """
        leaves = tf.nest.flatten(outputs)

        def components(leaf: Any) -> tuple[Any, ...]:
            return tuple(leaf.values) if isinstance(leaf, tf.distribute.DistributedValues) else (leaf,)

        scalars = [
            i
            for i, leaf in enumerate(leaves)
            if tf.is_tensor(components(leaf)[0])
            and components(leaf)[0].shape.rank == 0
            and components(leaf)[0].dtype == tf.float32
        ]
        if len(scalars) < 2:
            return outputs
        num_local = len(components(leaves[scalars[0]]))
        stacked = [tf.stack([components(leaves[i])[r] for i in scalars]) for r in range(num_local)]
        packed = input_values.per_replica(stacked) if num_local > 1 else stacked[0]
        means = super().reduce(tf.distribute.ReduceOp.MEAN, packed, None)  # type: ignore[misc]
        for position, i in enumerate(scalars):
            leaves[i] = means[position]
            self._mark_final(leaves[i], for_sum=False)
        return tf.nest.pack_sequence_as(outputs, leaves)

    def _final_outputs(self, for_sum: bool) -> weakref.WeakValueDictionary[int, Any]:
        """Logged values already reduced over every replica, by id (tensors do not hash).

        Keras reduces a step's logs right after `run`: Keras 3 averages each
        over the replicas (MEAN), tf-keras sums its metrics' results (SUM,
        of results identical on every replica once their variables are
        summed). A value registered for that reduction is its result
        already, and `reduce` returns it as it is.
        """
        name = "_final_for_sum" if for_sum else "_final_for_mean"
        if name not in vars(self):
            setattr(self, name, weakref.WeakValueDictionary())
        registry: weakref.WeakValueDictionary[int, Any] = getattr(self, name)
        return registry

    def _mark_final(self, leaf: Any, *, for_sum: bool) -> None:
        """Registers `leaf` as Keras's log already reduced (for MEAN; and SUM with `for_sum`)."""
        self._final_outputs(for_sum=False)[id(leaf)] = leaf
        if for_sum:
            self._final_outputs(for_sum=True)[id(leaf)] = leaf

    def _is_final(self, value: Any, for_sum: bool) -> bool:
        return tf.is_tensor(value) and self._final_outputs(for_sum).get(id(value)) is value

    def reduce(self, reduce_op: Any, value: Any, axis: int | None) -> Any:
        """`tf.distribute.Strategy.reduce`; see the module docstring for input values.

        While a fused train step is traced, its `reduce` answers first
        (tf-keras's metric reads: `tfdist/collectives/fused_step.py`).
        """
        fusion = getattr(self, "_fusion_tracing", None)
        if fusion is not None:
            noted = fusion.reduce(reduce_op, value, axis)
            if noted is not fusion.NOT_NOTED:
                return noted
        leaves = tf.nest.flatten(value)
        if reduce_op in _MEAN or reduce_op in _SUM:
            for_sum = reduce_op in _SUM
            if all(self._is_final(leaf, for_sum) for leaf in leaves):
                return value  # Keras's logs, already reduced over every replica.
        if axis is not None or not any(map(input_values.is_input_value, leaves)):
            return super().reduce(reduce_op, value, axis)  # type: ignore[misc]

        def reduce_leaf(leaf: Any) -> Any:
            if input_values.is_input_value(leaf):
                return tf.concat(list(leaf.values), axis=0)
            return super(DistributedInputMixin, self).reduce(  # type: ignore[misc]
                reduce_op, leaf, axis
            )

        return tf.nest.map_structure(reduce_leaf, value)


_MEAN = ("MEAN", tf.distribute.ReduceOp.MEAN)
_SUM = ("SUM", tf.distribute.ReduceOp.SUM)


def _has_distributed_values(data: Any) -> bool:
    return any(
        isinstance(leaf, tf.distribute.DistributedValues) for leaf in tf.nest.flatten(data)
    )
