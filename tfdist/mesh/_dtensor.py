"""The mesh strategy's tensors and variables, as TF's DTensor holds them.

`tf.experimental.dtensor` (public TF API) keeps a tensor as one component
per device of a mesh, each the slice its layout gives that device; an op on
such tensors runs on every device, and DTensor's SPMD expansion adds the
collectives the layouts need (an all-reduce after a row-split matmul, a
gather where an op needs a whole dimension). The mesh strategy turns
everything a Keras step touches into DTensors:

- `MeshVariable`: a `DVariable` that also accepts plain values (Keras's
  `set_weights`, `load_weights` and initial values are plain tensors:
  they are split to the variable's layout) and reads back whole
  (`numpy()`: Keras's `get_weights` and `save_weights`);
- `to_mesh(value, layout)`: a plain tensor onto the mesh, split by
  `layout` (the input batch, a variable's initial value);
- `whole(tensor)`: a DTensor gathered to every device (what `predict`
  returns, what a whole read gives);
- `forwarded_writes()`: the context a step is traced in, where a
  variable read after its write in the same step returns the value written
  (below).

Why writes are forwarded: in a traced step a variable read after a write
waits for the write through a control dependency (TF's automatic control
dependencies put it there: the traced graph is right). TF 2.21's DTensor
does not always keep that order when it expands the graph over the mesh.
Seen on 4 logical CPUs with the batch split over all four: once the model
has a 3-D kernel (an `EinsumDense` such as attention's projections), every
read of an optimizer slot after its write (SGD's momentum, Adam's moments)
returns the value before the write, so no weight moves at the first step
and each lags one step after; plain SGD, which reads no slot, was right.
Inside `forwarded_writes()` a read after a write in the same step is the
written value itself (a data dependency, which no reordering can break),
and `assign_add`/`assign_sub` write `value + delta` through `assign`.

Row lookups: a variable's `sparse_read` (tf-keras's `Embedding` looks a
table up through it) is a `ResourceGather` on the variable, which TF's
DTensor cannot run on a table split by rows; `MeshVariable.sparse_read`
gathers the rows from the value read instead, as Keras 3's `Embedding`
does (the gradient is the same rows, as `IndexedSlices`).

Row scatters: TF's DTensor has no layout rule for `ResourceScatterAdd`/`Sub`
(Keras 3's plain SGD and tf-keras's optimizers update an embedding table
through them), so `MeshVariable.scatter_add`/`scatter_sub` add the rows
as one dense update (the same sum, repeated rows included; it costs the
table's size).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from tfdist._internal import func_graphs
from tfdist.mesh import layouts as layouts_lib

__all__ = ["MeshVariable", "forwarded_writes", "layout", "make_mesh", "to_mesh", "whole"]

_written = threading.local()


def _dtensor_device(name: str) -> str:
    """'cpu:0', '/device:CPU:0', '/job:localhost/.../device:CPU:0' -> 'CPU:0'."""
    name = name.rsplit("device:", 1)[-1].lstrip("/")
    kind, _, index = name.rpartition(":")
    return f"{kind.upper()}:{index}"


def make_mesh(spec: layouts_lib.MeshSpec) -> dtensor.Mesh:
    """DTensor's mesh over `spec`'s devices (this process's), axes and shape."""
    return dtensor.create_mesh(
        list(zip(spec.axis_names, spec.shape)),
        devices=[_dtensor_device(d) for d in spec.devices],
    )


def layout(mesh: dtensor.Mesh, axes: Sequence[str | None]) -> dtensor.Layout:
    """DTensor's layout for `axes` (None: the dimension whole)."""
    return dtensor.Layout([a if a is not None else dtensor.UNSHARDED for a in axes], mesh)


def to_mesh(value: Any, target: dtensor.Layout) -> tf.Tensor:
    """`value` as a DTensor laid out by `target` (eagerly; a DTensor is relaid out)."""
    value = tf.convert_to_tensor(value)
    if not dtensor.is_dtensor(value):
        value = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(target.mesh, value.shape.rank))
    return dtensor.relayout(value, target)


def whole(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` gathered whole on every device (in a function or eagerly)."""
    return dtensor.relayout(tensor, dtensor.Layout.replicated(dtensor.fetch_layout(tensor).mesh, tensor.shape.rank))


@contextlib.contextmanager
def forwarded_writes() -> Iterator[None]:
    """Within (in a function being traced): a `MeshVariable` read after its write returns what was written.

    Who calls: the mesh strategy, around each step it traces (module
    docstring: why). Eager code runs in order and is left as it is. Where a
    write is forwarded: to later reads in the function that wrote it and in
    the `tf.cond` branches inside it. A `tf.while_loop` body, a nested
    `tf.function` or anything after a branch that wrote reads the variable
    itself (correct, though not shielded from DTensor's reordering). A
    forwarded read is still a read to `GradientTape`. Not shared across
    threads: the record is per thread.
    """
    previous = getattr(_written, "values", None)
    _written.values = {}
    try:
        yield
    finally:
        _written.values = previous


def _encloses(outer: Any, graph: Any) -> bool:
    """Whether `graph` is `outer` or a `tf.cond` branch traced inside it, at any depth.

    Only branches: each runs at most once, in program order, so a value
    written in `outer` before the branch is the variable's value in it. A
    `tf.while_loop` body runs many times (after its own writes), and a
    nested `tf.function` is traced once and called at other times: a value
    captured into either would go stale, so they read the variable.
    """
    while graph is not None:
        if graph is outer:
            return True
        if not func_graphs.is_cond_branch(graph):
            return False
        graph = graph.outer_graph
    return False


class MeshVariable(dtensor.DVariable):
    """A `DVariable` that takes plain values and reads back whole (module docstring).

    Args:
      initial_value: A DTensor with the variable's layout.
      **kwargs: `tf.Variable`'s (trainable, name, dtype).
    """

    def _on_mesh(self, value: Any) -> Any:
        value = tf.convert_to_tensor(value, dtype=self.dtype)
        if not tf.executing_eagerly() or dtensor.is_dtensor(value):
            return value  # In a step every value is a DTensor already.
        return to_mesh(value, self.layout)

    def _writes(self) -> dict[int, tuple[Any, tf.Tensor]] | None:
        """The step's record of written values, when writes are forwarded here (a trace)."""
        values = getattr(_written, "values", None)
        return None if values is None or tf.executing_eagerly() else values

    def _forwarded(self, read: Any) -> tf.Tensor:
        """`read()`, or the value this step last wrote where a read here may use it.

        A forwarded value is still a read of the variable to a
        `GradientTape`: the variable is read too and the result is
        `written + (read - read)`, the written value exactly (x - x is 0 for
        any finite x; a variable holding inf or NaN would turn it NaN), with
        the gradient of a read: to the variable, not into what was written
        (`train_step`s that write a weight and then differentiate through
        it need this, e.g. SAM). `tf.custom_gradient` cannot do it here:
        TF's DTensor returned the read, not the written value, through its
        IdentityN.
        """
        writes = self._writes()
        entry = None if writes is None else writes.get(id(self))
        if entry is None or not _encloses(entry[0], tf.compat.v1.get_default_graph()):
            return read()
        value_read = read()  # Possibly the stale value (module docstring): only its gradient is used.
        return tf.stop_gradient(entry[1]) + (value_read - tf.stop_gradient(value_read))

    def value(self) -> tf.Tensor:
        return self._forwarded(super().value)

    def read_value(self) -> tf.Tensor:
        return self._forwarded(super().read_value)

    def numpy(self) -> np.ndarray:
        """The whole value (gathered from the devices' slices)."""
        return dtensor.unpack(whole(self.read_value()))[0].numpy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        del copy  # numpy() is always a fresh array.
        return np.asarray(self.numpy(), dtype=dtype)

    def assign(self, value: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> Any:
        value = self._on_mesh(value)
        writes = self._writes()
        if writes is not None:
            writes[id(self)] = (tf.compat.v1.get_default_graph(), value)
        return super().assign(value, use_locking, name, read_value)

    def assign_add(self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> Any:
        if self._writes() is not None:  # value + delta, data-dependent on the read.
            return self.assign(self.value() + self._on_mesh(delta), use_locking, name, read_value)
        return super().assign_add(self._on_mesh(delta), use_locking, name, read_value)

    def assign_sub(self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True) -> Any:
        if self._writes() is not None:
            return self.assign(self.value() - self._on_mesh(delta), use_locking, name, read_value)
        return super().assign_sub(self._on_mesh(delta), use_locking, name, read_value)

    def sparse_read(self, indices: Any, name: Any = None) -> tf.Tensor:
        """Rows `indices`, gathered from the value read (module docstring: row lookups)."""
        del name
        return tf.gather(self.value(), indices)

    def scatter_add(self, sparse_delta: tf.IndexedSlices, use_locking: bool = False, name: Any = None) -> Any:
        """Adds `sparse_delta`'s rows as one dense update (module docstring: row scatters)."""
        del use_locking, name
        return self.assign_add(self._rows_dense(sparse_delta))

    def scatter_sub(self, sparse_delta: tf.IndexedSlices, use_locking: bool = False, name: Any = None) -> Any:
        """Subtracts `sparse_delta`'s rows as one dense update (module docstring: row scatters)."""
        del use_locking, name
        return self.assign_sub(self._rows_dense(sparse_delta))

    def _rows_dense(self, sparse_delta: tf.IndexedSlices) -> tf.Tensor:
        """`sparse_delta` as a dense update of this variable's shape, repeated rows summed."""
        return tf.math.unsorted_segment_sum(
            tf.cast(sparse_delta.values, self.dtype), sparse_delta.indices, num_segments=self.shape[0]
        )
