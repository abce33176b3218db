"""Per-replica input values that remember their global batch (TF private).

tfdist strategies hand each replica its slice of a global batch as a TF
`PerReplica` (what `strategy.run` splits over replicas and what users'
custom loops receive). `InputPerReplica` is that `PerReplica` plus two facts
about the global batch it was cut from, which no single slice can tell:

- `global_rows`: the rows of the whole global batch (over all replicas and
  workers), a scalar int64 tensor, or -1 where unknown (e.g. a
  `dataset_fn` of the user's that batches per replica);
- `nominal_batch_size`: the batch size the user asked for (the static batch
  dimension, or the first batch's rows), a Python int or None; kept in the
  type spec, so it is known when a step function is traced.

Both travel through `tf.data`, `tf.function` arguments, `tf.while_loop`
variables and `tf.experimental.Optional` (they are part of the type spec's
components and serialization), and are dropped as soon as a replica's
component is selected: inside `strategy.run` a replica sees its plain
tensor. Everything else (`values`, `isinstance(x, PerReplica)`,
`experimental_local_results`) behaves as TF's `PerReplica`.

Private TF API used: `values.PerReplica` and `values.PerReplicaSpec`
(TF has no public constructor of per-replica values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import values as _values

__all__ = ["InputPerReplica", "InputPerReplicaSpec", "is_input_value", "per_replica"]

#: `global_rows` of an input whose global batch is not known.
UNKNOWN_ROWS = -1


class InputPerReplica(_values.PerReplica):
    """A `PerReplica` input slice set with its global batch's row count.

    Args:
      values: One tensor (or composite tensor) per local replica.
      global_rows: Scalar int64 tensor: rows of the global batch over all
        replicas and workers, or `UNKNOWN_ROWS`.
      nominal_batch_size: The global batch size the input was batched
        with, or None if not known.
    """

    def __init__(
        self,
        values: Sequence[Any],
        global_rows: Any,
        nominal_batch_size: int | None,
    ) -> None:
        super().__init__(tuple(values))
        self._global_rows = global_rows
        self._nominal_batch_size = nominal_batch_size

    @property
    def global_rows(self) -> tf.Tensor:
        """Rows of the global batch (int64 scalar; -1 if unknown)."""
        return self._global_rows

    @property
    def nominal_batch_size(self) -> int | None:
        """The global batch size of the input, if known."""
        return self._nominal_batch_size

    @property
    def _type_spec(self) -> InputPerReplicaSpec:
        return InputPerReplicaSpec(
            tuple(tf.type_spec_from_value(v) for v in self._values),
            self._nominal_batch_size,
        )


class InputPerReplicaSpec(_values.PerReplicaSpec):
    """Type spec of `InputPerReplica`: the replicas' specs plus the rows."""

    __slots__ = ["_nominal_batch_size"]

    def __init__(
        self, value_specs: Sequence[tf.TypeSpec], nominal_batch_size: int | None
    ) -> None:
        super().__init__(*value_specs)
        self._nominal_batch_size = nominal_batch_size

    @property
    def value_type(self) -> type[InputPerReplica]:
        return InputPerReplica

    @property
    def nominal_batch_size(self) -> int | None:
        return self._nominal_batch_size

    def _serialize(self) -> tuple[Any, ...]:
        return (self._value_specs, self._nominal_batch_size)

    @property
    def _component_specs(self) -> tuple[tf.TypeSpec, ...]:
        return self._value_specs + (tf.TensorSpec([], tf.int64),)

    def _to_components(self, value: InputPerReplica) -> tuple[Any, ...]:
        values = super()._to_components(value)  # Checks the context as TF.
        return tuple(values) + (value.global_rows,)

    def _from_components(self, components: Sequence[Any]) -> InputPerReplica:
        *values, global_rows = components
        return InputPerReplica(values, global_rows, self._nominal_batch_size)


def is_input_value(value: Any) -> bool:
    """True for an `InputPerReplica` (a tfdist input slice set)."""
    return isinstance(value, InputPerReplica)


def per_replica(values: Sequence[Any]) -> Any:
    """A plain TF `PerReplica` of `values` (one per local replica)."""
    return _values.PerReplica(tuple(values))
