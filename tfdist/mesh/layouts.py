"""Device meshes and variable layouts, checked before anything is built (no TensorFlow).

A **mesh** is a grid of devices with named axes: `{"batch": 2, "model": 2}`
puts 4 devices in 2 rows of 2. A **layout** gives each dimension of a
tensor a mesh axis it is split over, or None (whole on every device of that
axis): a `(None, "model")` kernel of shape (8, 16) holds columns 0-7 on the
devices of model coordinate 0 and columns 8-15 on those of coordinate 1.

    mesh = MeshSpec.from_user({"batch": 2, "model": 2}, devices)
    layouts = LayoutRules.from_user({".*dense.*kernel": (None, "model")}, mesh)
    layouts.axes_for("sequential/dense/kernel", (8, 16))   # (None, "model")

Users pass Keras 3's own `keras.distribution.DeviceMesh` and `LayoutMap`
(read through their public attributes), tfdist's `DeviceMesh` and
`LayoutMap` of the same signatures (for tf-keras, which has no
`keras.distribution`), or dicts. Keys of a layout map are
regular expressions that must match a variable's whole Keras path
(`re.fullmatch`, as Keras's `LayoutMap` does); a path two keys match is an
error, as in Keras. Every check raises `tfdist.errors.LayoutError` naming
the value and the fix.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tfdist import errors

__all__ = ["AutomaticLayouts", "Axes", "DeviceMesh", "LayoutMap", "LayoutRules", "MeshSpec"]

#: The mesh axis each dimension of a tensor is split over (None for whole), in order.
Axes = tuple[str | None, ...]


class DeviceMesh:
    """A grid of devices with named axes: Keras 3's `keras.distribution.DeviceMesh`, for tf-keras.

    Args:
      shape: Devices along each axis, e.g. `(2, 2)`.
      axis_names: A name per axis, e.g. `("batch", "model")`.
      devices: Device names in row-major order over `shape`; None: this
        process's devices (`tfdist.local_devices()`) when the strategy is made.
    """

    def __init__(
        self,
        shape: Sequence[int],
        axis_names: Sequence[str],
        devices: Sequence[str] | None = None,
    ) -> None:
        self.shape = tuple(shape)
        self.axis_names = tuple(axis_names)
        self.devices = None if devices is None else tuple(str(d) for d in devices)
        if len(self.shape) != len(self.axis_names):
            raise errors.LayoutError(
                f"DeviceMesh needs one axis name per dimension; received shape={self.shape!r} "
                f"and axis_names={self.axis_names!r}."
            )


class LayoutMap(dict):  # type: ignore[type-arg]
    """Variable path patterns to layouts: Keras 3's `keras.distribution.LayoutMap`, for tf-keras.

    `layout_map[pattern] = axes`, one entry per dimension of the variables
    the pattern matches (a mesh axis name, or None for whole). Patterns
    match a variable's whole path (`re.fullmatch`).

    Args:
      device_mesh: The mesh the axes name (kept for Keras's signature; the
        strategy's mesh is the one used).
    """

    def __init__(self, device_mesh: DeviceMesh | None = None) -> None:
        super().__init__()
        self.device_mesh = device_mesh


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """A validated device mesh.

    Attributes:
      axis_names: The axes, outermost first.
      shape: Devices along each axis.
      devices: Device names in row-major order over `shape`.
    """

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    devices: tuple[str, ...]

    @property
    def size(self) -> int:
        """The number of devices."""
        size = 1
        for extent in self.shape:
            size *= extent
        return size

    def axis_size(self, name: str) -> int:
        """Devices along axis `name` (which must be one of `axis_names`)."""
        return self.shape[self.axis_names.index(name)]

    @classmethod
    def from_user(cls, mesh: Any, local_devices: Sequence[str]) -> MeshSpec:
        """A mesh from a Keras `DeviceMesh`, a `MeshSpec` or a `{axis: size}` dict.

        A dict places its axes over `local_devices`, in order; a Keras mesh
        brings its own devices (Keras names them "cpu:0", TF "/device:CPU:0":
        both are accepted).

        Raises:
          LayoutError: An empty or non-positive shape, repeated axis names,
            or a mesh whose size is not its number of devices.
        """
        if isinstance(mesh, MeshSpec):
            return mesh
        if isinstance(mesh, DeviceMesh) and mesh.devices is None:
            mesh = dict(zip(mesh.axis_names, mesh.shape))
        if isinstance(mesh, Mapping):
            names = tuple(mesh)
            shape = tuple(mesh.values())
            devices: tuple[str, ...] = tuple(local_devices)
            source = f"mesh={dict(mesh)!r}"
        elif hasattr(mesh, "axis_names") and hasattr(mesh, "shape") and hasattr(mesh, "devices"):
            names = tuple(mesh.axis_names)
            shape = tuple(int(s) for s in mesh.shape)
            flat = mesh.devices.flatten() if hasattr(mesh.devices, "flatten") else mesh.devices
            devices = tuple(str(d) for d in flat)
            source = f"DeviceMesh(shape={shape}, axis_names={names})"
        else:
            raise errors.LayoutError(
                f"mesh must be a keras.distribution.DeviceMesh or a dict of axis sizes; "
                f"received mesh={mesh!r}. Pass e.g. {{'batch': 2, 'model': 2}}."
            )
        if not names or any(not isinstance(n, str) or not n for n in names):
            raise errors.LayoutError(
                f"a mesh needs one or more named axes; received {source}. "
                "Name every axis with a non-empty string."
            )
        if len(set(names)) != len(names):
            raise errors.LayoutError(
                f"mesh axis names must be distinct; received {source}. Rename the repeated axis."
            )
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
            raise errors.LayoutError(
                f"every mesh axis needs a size of 1 or more; received {source}."
            )
        spec = cls(names, shape, devices)
        if spec.size != len(devices):
            raise errors.LayoutError(
                f"the mesh has {spec.size} positions ({' x '.join(map(str, shape))}) but "
                f"{len(devices)} device(s); received {source} over devices={list(devices)}. "
                f"Give axis sizes whose product is {len(devices)}, or "
                f"{'simulate more devices (tfdist.simulate_cpu_devices)' if spec.size > len(devices) else 'pass fewer devices'}."
            )
        return spec


@dataclasses.dataclass(frozen=True)
class LayoutRules:
    """Which layout each variable gets: the first and only pattern matching its path.

    Attributes:
      mesh: The mesh the axes name.
      rules: `(pattern, axes)` in the order given.
    """

    mesh: MeshSpec
    rules: tuple[tuple[str, Axes], ...]
    matched: set[str] = dataclasses.field(default_factory=set, compare=False, repr=False)

    def unused(self) -> list[str]:
        """The patterns that matched no variable so far (a key missing its `.*` prefix, a layer output's)."""
        return [pattern for pattern, _ in self.rules if pattern not in self.matched]

    @classmethod
    def from_user(cls, layout_map: Any, mesh: MeshSpec) -> LayoutRules:
        """Rules from a Keras `LayoutMap` or a `{pattern: axes}` dict (None: none).

        Raises:
          LayoutError: An invalid pattern, or axes naming an axis the mesh
            lacks or one axis twice.
        """
        if layout_map is None:
            return cls(mesh, ())
        if not isinstance(layout_map, Mapping):
            raise errors.LayoutError(
                f"layout_map must be a keras.distribution.LayoutMap or a dict of "
                f"{{pattern: axes}}; received layout_map={layout_map!r}."
            )
        rules = []
        for pattern, layout in layout_map.items():
            axes: Axes = tuple(getattr(layout, "axes", None) or layout or ())
            try:
                re.compile(pattern)
            except re.error as error:
                raise errors.LayoutError(
                    f"layout_map key {pattern!r} is not a regular expression ({error}). "
                    "Keys are matched against the whole variable path, e.g. '.*dense.*kernel'."
                ) from None
            for axis in axes:
                if axis is not None and axis not in mesh.axis_names:
                    raise errors.LayoutError(
                        f"layout_map[{pattern!r}] = {axes!r} names axis {axis!r}, which the mesh "
                        f"does not have; its axes are {list(mesh.axis_names)}. Use one of them, "
                        "or None for a dimension kept whole."
                    )
            named = [a for a in axes if a is not None]
            if len(set(named)) != len(named):
                raise errors.LayoutError(
                    f"layout_map[{pattern!r}] = {axes!r} splits two dimensions over one mesh axis; "
                    "give each axis to at most one dimension."
                )
            rules.append((pattern, axes))
        return cls(mesh, tuple(rules))

    def explain(self, path: str) -> str:
        """Why `path` gets its layout: the `layout_map` key matching it, or none."""
        for pattern, _ in self.rules:
            if re.fullmatch(pattern, path):
                return f"layout_map[{pattern!r}]"
        return "no layout_map key: whole"

    def axes_for(self, path: str, shape: Sequence[int]) -> Axes:
        """The layout of variable `path` of `shape`: its rule's axes, or whole (all None).

        Raises:
          LayoutError: Two patterns match `path`; its rule's rank is not the
            variable's; or a split dimension is not divisible by its axis.
        """
        shape = tuple(int(s) for s in shape)
        matches = [(p, a) for p, a in self.rules if re.fullmatch(p, path)]
        if len(matches) > 1:
            raise errors.LayoutError(
                f"variable {path!r} matches {len(matches)} layout_map keys "
                f"{[p for p, _ in matches]}; make the patterns match at most one each."
            )
        if not matches:
            return (None,) * len(shape)
        pattern, axes = matches[0]
        self.matched.add(pattern)
        if len(axes) != len(shape):
            raise errors.LayoutError(
                f"layout_map[{pattern!r}] = {axes!r} has {len(axes)} entries but variable "
                f"{path!r} has shape {shape} ({len(shape)} dimension(s)). Give one entry "
                "per dimension, or narrow the pattern."
            )
        for dimension, (extent, axis) in enumerate(zip(shape, axes)):
            if axis is None:
                continue
            size = self.mesh.axis_size(axis)
            if extent % size:
                fitting = [
                    f"{n}={s}" for n, s in zip(self.mesh.axis_names, self.mesh.shape)
                    if extent % s == 0 and s > 1
                ]
                raise errors.LayoutError(
                    f"variable {path!r} of shape {shape} cannot split dimension {dimension} "
                    f"({extent}) over mesh axis {axis!r} of size {size}: {extent} is not a "
                    f"multiple of {size}. Use a mesh axis whose size divides {extent}"
                    f"{' (' + ', '.join(fitting) + ')' if fitting else ''}, keep the "
                    "dimension whole (None), or change the layer's size."
                )
        return axes


#: Parent layer names of Keras's `MultiHeadAttention` projections.
_ATTENTION_INPUTS = ("query", "key", "value")
_ATTENTION_OUTPUT = "attention_output"


class AutomaticLayouts:
    """Megatron's layouts, chosen variable by variable as a model is built (`layout_map=None`).

    Rules, over the mesh's model axis (its first axis other than the batch
    axis; with none, every variable stays whole), each applied only where
    the dimension it splits divides that axis's size (else whole):

    - `MultiHeadAttention` by heads: the query, key and value kernels
      `(d, heads, head_dim)` split their heads, and their biases; the output
      kernel `(heads, head_dim, d)` its heads (one all-reduce after it);
    - `Dense` in pairs: a 2-D kernel is column-parallel (its outputs split),
      and the next 2-D kernel whose inputs are those outputs is
      row-parallel (one all-reduce after it), as Megatron pairs an MLP's two
      layers; a column-parallel layer's bias is split with its outputs;
    - other kernels of 3 or more dimensions whole: TF 2.21's DTensor runs
      a convolution only with its whole filter ("Filter for convolution
      must have fully replicated layout"), and such a kernel may be one;
    - embedding tables by rows (vocabulary-parallel, as Megatron splits
      its token table: each device looks up the rows it holds, one
      all-reduce after); nothing else (normalization, metrics, counters).

    The rules see each variable's path and shape in creation order (Keras
    builds a layer's kernel, then its bias); `explain(path)` says which rule
    chose its layout.

    Args:
      mesh: The mesh.
      batch_dim_name: The batch axis (never used to split a variable).
    """

    def __init__(self, mesh: MeshSpec, batch_dim_name: str) -> None:
        self.mesh = mesh
        others = [n for n in mesh.axis_names if n != batch_dim_name]
        self._axis = others[0] if others else None
        self._size = mesh.axis_size(self._axis) if self._axis else 1
        self._column_outputs: int | None = None  # Outputs of the last unpaired column layer.
        self._split_layers: set[str] = set()  # Layers whose outputs are split (their bias follows).
        self._reasons: dict[str, str] = {}

    def unused(self) -> list[str]:
        """None: the rules use no user patterns."""
        return []

    def explain(self, path: str) -> str:
        """Why `path` got its layout."""
        return self._reasons.get(path, "whole")

    def axes_for(self, path: str, shape: Sequence[int]) -> Axes:
        """The layout of variable `path` of `shape`, by the rules above."""
        shape = tuple(int(s) for s in shape)
        axes, reason = self._choose(path, shape)
        self._reasons[path] = reason
        return axes

    def _divides(self, extent: int) -> bool:
        return self._axis is not None and self._size > 1 and extent % self._size == 0

    def _choose(self, path: str, shape: tuple[int, ...]) -> tuple[Axes, str]:
        whole: Axes = (None,) * len(shape)
        layer, _, leaf = path.rpartition("/")
        parent = layer.rpartition("/")[2]
        m = self._axis
        if leaf == "embeddings" and len(shape) == 2:
            if self._divides(shape[0]):
                return (m, None), "embedding: split by rows (vocabulary-parallel)"
            return whole, f"embedding: {shape[0]} rows do not divide {m}={self._size}"
        if leaf == "kernel" and len(shape) == 3 and parent in _ATTENTION_INPUTS:
            if self._divides(shape[1]):
                self._split_layers.add(layer)
                return (None, m, None), f"attention {parent} projection: split by heads"
            return whole, f"attention {parent}: {shape[1]} heads do not divide {m}={self._size}"
        if leaf == "kernel" and len(shape) == 3 and parent == _ATTENTION_OUTPUT:
            if self._divides(shape[0]):
                return (m, None, None), "attention output: split by heads (all-reduce after)"
            return whole, f"attention output: {shape[0]} heads do not divide {m}={self._size}"
        if leaf == "kernel" and len(shape) == 2:
            if self._column_outputs == shape[0] and self._divides(shape[0]):
                self._column_outputs = None
                return (m, None), "Dense, row-parallel: inputs of the column-parallel layer before it"
            if self._divides(shape[1]):
                self._column_outputs = shape[1]
                self._split_layers.add(layer)
                return (None, m), "Dense, column-parallel: outputs split"
            self._column_outputs = None
            return whole, f"Dense: {shape[1]} outputs do not divide {m}={self._size}"
        if leaf == "kernel" and len(shape) >= 3:
            self._column_outputs = None
            return whole, "convolution (or einsum) kernel: whole (TF's DTensor convolves only whole filters)"
        if leaf == "bias" and layer in self._split_layers and shape and self._divides(shape[0]):
            return (m,) + whole[1:], "bias of a layer whose outputs are split"
        return whole, "whole"
