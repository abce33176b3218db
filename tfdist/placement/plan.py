"""Which contiguous stage of a model's layers runs on which device (pure Python).

A model's top-level layers, in the order they run (a topological order of
its layer graph), are cut into contiguous **stages**, one per device. The
planner sees only numbers (`LayerGraph`): what each layer costs and how many
activation bytes flow between layers; it imports no TensorFlow, so it is
tested on fake devices.

Balanced plan (`plan_stages`)::

    n layers, D devices: S = min(n, D) stages   # more devices than layers:
                                                # one layer each, the rest idle
    cost(i) = params | flops | measured seconds of layer i (`balance_by`)
    phase 1: B* = min over contiguous S-way partitions of the largest stage
             cost (the pipeline's bottleneck)
             best[s][i] = min_p max(best[s-1][p], cost(p..i-1))
             best[s-1][p] grows with p and cost(p..i-1) shrinks with p, so
             the optimal p is found by binary search: O(S n log n)
    phase 2: among partitions whose every stage costs <= B*, minimise the
             activation bytes crossing the cuts (the second cost)
             cuts[s][i] = min_{p: cost(p..i-1) <= B*} cuts[s-1][p] + bytes(p)
             the feasible p form a window that only moves right: O(S n)
    stage s -> devices[s]

Both phases are exact: the plan's bottleneck is the optimum over all
contiguous partitions (tests check it by brute force), and no plan with that
bottleneck moves fewer bytes between stages.

A user's assignment (`plan_from_assignment`, for `placement={layer: device}`
or a callable's result) becomes stages the same way: maximal runs of
consecutive layers on one device; layers it does not name follow the layer
before them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from tfdist import errors

__all__ = [
    "BALANCE_BY",
    "ActivationEdge",
    "LayerGraph",
    "LayerProfile",
    "PlacementPlan",
    "Stage",
    "bubble_fraction",
    "ideal_speedup",
    "plan_from_assignment",
    "plan_stages",
]

#: What a balanced plan equalises across stages.
BALANCE_BY = ("params", "flops", "measured")


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """What one top-level layer costs, per microbatch.

    Attributes:
      name: The layer's name (unique within its model).
      params: Number of weights (trainable and not).
      param_bytes: Bytes of those weights.
      flops: Forward floating-point operations for one microbatch, or None
        if not counted.
      measured_s: Seconds of one forward and backward pass of the layer on
        one microbatch, timed on the device, or None if not timed.
    """

    name: str
    params: int = 0
    param_bytes: int = 0
    flops: float | None = None
    measured_s: float | None = None

    def cost(self, balance_by: str) -> float:
        """This layer's cost under `balance_by` (a missing count is 0)."""
        if balance_by == "params":
            return float(self.params)
        if balance_by == "flops":
            return float(self.flops or 0.0)
        return float(self.measured_s or 0.0)


@dataclasses.dataclass(frozen=True)
class ActivationEdge:
    """Activations that layer `producer` hands to layer `consumer`.

    Attributes:
      producer: Index of the producing layer in `LayerGraph.layers`.
      consumer: Index of the consuming layer, > `producer`.
      num_bytes: Bytes per microbatch.
    """

    producer: int
    consumer: int
    num_bytes: int


@dataclasses.dataclass(frozen=True)
class LayerGraph:
    """A model's top-level layers in execution order, and the data between them.

    Attributes:
      layers: One profile per top-level layer, in the order they first run.
      edges: Activations passed between layers (model inputs excluded).

    Raises:
      PlacementError: If there are no layers or an edge does not point
        forward between existing layers.
    """

    layers: tuple[LayerProfile, ...]
    edges: tuple[ActivationEdge, ...] = ()

    def __post_init__(self) -> None:
        if not self.layers:
            raise errors.PlacementError(
                "the model has no layers to place (received layers=()). "
                "Build the model (call it on a batch, or give it an Input) "
                "before it is placed."
            )
        n = len(self.layers)
        for edge in self.edges:
            if not 0 <= edge.producer < edge.consumer < n:
                raise errors.PlacementError(
                    f"activation edge {edge!r} does not point forward between "
                    f"layers 0..{n - 1}. Layers must be listed in execution "
                    "order."
                )

    @property
    def names(self) -> tuple[str, ...]:
        """The layers' names, in order."""
        return tuple(layer.name for layer in self.layers)

    def cut_bytes(self) -> tuple[int, ...]:
        """Bytes crossing each cut: entry c is between layers c and c + 1."""
        crossing = [0] * len(self.layers)
        for edge in self.edges:
            crossing[edge.producer] += edge.num_bytes
            crossing[edge.consumer] -= edge.num_bytes
        running, result = 0, []
        for delta in crossing[:-1]:
            running += delta
            result.append(running)
        return tuple(result)


@dataclasses.dataclass(frozen=True)
class Stage:
    """A contiguous run of layers on one device.

    Attributes:
      index: Position in the pipeline, 0 first.
      device: The device that holds the stage's variables and runs its ops.
      layer_indices: Indices into `LayerGraph.layers`, consecutive.
      layers: The layers' names.
      cost: Sum of the layers' costs under the plan's `balance_by`.
      params: Weights of the stage.
      param_bytes: Bytes of those weights.
      output_bytes: Activation bytes per microbatch crossing the cut after
        this stage (0 for the last stage).
    """

    index: int
    device: str
    layer_indices: tuple[int, ...]
    layers: tuple[str, ...]
    cost: float
    params: int
    param_bytes: int
    output_bytes: int


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """Stages of a model, each on a device.

    Attributes:
      stages: The stages in pipeline order.
      balance_by: The cost the plan balanced or reports ("params", "flops"
        or "measured").
      idle_devices: Devices given that got no layer (more devices than
        layers).
    """

    stages: tuple[Stage, ...]
    balance_by: str
    idle_devices: tuple[str, ...] = ()

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def bottleneck(self) -> float:
        """The largest stage cost."""
        return max(stage.cost for stage in self.stages)

    @property
    def devices(self) -> tuple[str, ...]:
        """Each stage's device, in pipeline order (a device may repeat)."""
        return tuple(stage.device for stage in self.stages)

    def layer_devices(self) -> tuple[str, ...]:
        """The device of every layer, by layer index."""
        return tuple(
            stage.device for stage in self.stages for _ in stage.layer_indices
        )

    def device_of(self, layer_name: str) -> str:
        """The device of the layer named `layer_name`.

        Raises:
          PlacementError: If no stage holds such a layer.
        """
        for stage in self.stages:
            if layer_name in stage.layers:
                return stage.device
        raise errors.PlacementError(
            f"layer_name={layer_name!r} is in no stage of this plan; its "
            f"layers are {[n for s in self.stages for n in s.layers]}."
        )


def ideal_speedup(num_stages: int, num_microbatches: int) -> float:
    """GPipe's ideal speed-up over one microbatch: S·M / (M + S − 1)."""
    return num_stages * num_microbatches / (num_microbatches + num_stages - 1)


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """Share of each stage's step spent idle in GPipe's schedule: (S − 1) / (M + S − 1)."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def plan_stages(
    graph: LayerGraph, devices: Sequence[str], *, balance_by: str = "params"
) -> PlacementPlan:
    """Cuts `graph`'s layers into contiguous stages with the smallest bottleneck.

    See the module docstring for the algorithm. With more devices than
    layers, every layer gets a stage of its own on the first devices and the
    remaining devices are listed in `idle_devices`.

    Args:
      graph: The layers in execution order, with their costs.
      devices: Candidate devices, one stage each, in pipeline order.
      balance_by: "params", "flops" or "measured".

    Returns:
      The plan; among plans with the optimal bottleneck, the one moving the
      fewest activation bytes between stages.

    Raises:
      ConfigError: If `balance_by` is unknown or `devices` is empty.
      PlacementError: If `balance_by="measured"` and a layer has no time.

    Example:
      >>> graph = LayerGraph(tuple(LayerProfile(f"d{i}", params=p)
      ...                          for i, p in enumerate([4, 1, 1, 2])))
      >>> [s.layers for s in plan_stages(graph, ["/cpu:0", "/cpu:1"]).stages]
      [('d0',), ('d1', 'd2', 'd3')]
    """
    _check_balance_by(balance_by)
    if not devices:
        raise errors.ConfigError(
            "devices=[] is empty; a plan needs at least one device."
        )
    if balance_by == "measured":
        missing = [layer.name for layer in graph.layers if layer.measured_s is None]
        if missing:
            raise errors.PlacementError(
                f"balance_by='measured' but layers {missing} were not timed. "
                "Time every layer (LayerProfile.measured_s) or balance by "
                "'params' or 'flops'."
            )
    costs = [layer.cost(balance_by) for layer in graph.layers]
    negative = [(layer.name, c) for layer, c in zip(graph.layers, costs) if c < 0]
    if negative:
        raise errors.PlacementError(
            f"layer costs must be >= 0; received {negative} for "
            f"balance_by={balance_by!r}. Report non-negative counts or times."
        )
    num_stages = min(len(costs), len(devices))
    starts = _balanced_starts(costs, graph.cut_bytes(), num_stages)
    return _make_plan(
        graph,
        starts,
        tuple(devices[:num_stages]),
        balance_by=balance_by,
        idle_devices=tuple(devices[num_stages:]),
    )


def plan_from_assignment(
    graph: LayerGraph,
    assignment: Mapping[str, str],
    *,
    devices: Sequence[str] | None = None,
    balance_by: str = "params",
) -> PlacementPlan:
    """Stages from a `{layer name: device}` assignment.

    Stages are the maximal runs of consecutive layers on one device (a
    device may hold several runs). A layer the assignment does not name
    runs on the device of the layer before it (the first layers, on the
    device of the first named layer).

    Args:
      graph: The layers in execution order.
      assignment: Device of some or all layers, by name.
      devices: If given, the devices that must each get at least one layer;
        every assigned device must be among them.
      balance_by: The cost reported per stage.

    Raises:
      PlacementError: If the assignment is empty, names a layer the model
        does not have, names the same layer twice in the model, uses a
        device outside `devices`, leaves one of `devices` without a layer,
        or `devices` has more entries than the model has layers.
    """
    _check_balance_by(balance_by)
    names = graph.names
    if not assignment:
        raise errors.PlacementError(
            "placement={} names no layer. Map at least one layer name to a "
            f"device, e.g. {{{names[0]!r}: '/cpu:0'}}, or use "
            "placement='balanced'."
        )
    unknown = sorted(set(assignment) - set(names))
    if unknown:
        raise errors.PlacementError(
            f"placement names layer(s) {unknown} that the model does not have. "
            f"Its top-level layers, in execution order, are {list(names)}; "
            "use those names (nested layers follow their top-level layer)."
        )
    repeated = sorted({n for n in names if names.count(n) > 1 and n in assignment})
    if repeated:
        raise errors.PlacementError(
            f"placement names layer(s) {repeated}, but the model has several "
            "top-level layers with that name. Give the layers unique names "
            "(name= argument), or use placement='balanced'."
        )
    if devices is not None:
        outside = sorted(set(assignment.values()) - set(devices))
        if outside:
            raise errors.PlacementError(
                f"placement assigns device(s) {outside}, which are not among "
                f"devices={list(devices)}. Add them to devices, or pass "
                "devices=None to use the devices the placement names."
            )
        if len(devices) > len(names):
            raise errors.PlacementError(
                f"devices={list(devices)} asks for {len(devices)} stages but "
                f"the model has only {len(names)} layers ({list(names)}), so "
                "some device would get no layer. Pass at most "
                f"{len(names)} devices (or devices=None), or use "
                "placement='balanced', which leaves extra devices idle."
            )
    first = next(assignment[n] for n in names if n in assignment)
    per_layer, current = [], first
    for name in names:
        current = assignment.get(name, current)
        per_layer.append(current)
    if devices is not None:
        empty = [d for d in devices if d not in per_layer]
        if empty:
            raise errors.PlacementError(
                f"devices {empty} get no layer from placement={dict(assignment)!r}. "
                "Map a layer to each of them, or leave them out of devices."
            )
    starts = [0] + [i for i in range(1, len(names)) if per_layer[i] != per_layer[i - 1]]
    return _make_plan(
        graph,
        starts,
        tuple(per_layer[i] for i in starts),
        balance_by=balance_by,
        idle_devices=(),
    )


def _check_balance_by(balance_by: object) -> None:
    if balance_by not in BALANCE_BY:
        raise errors.ConfigError(
            f"balance_by={balance_by!r} is not supported. Expected one of "
            f"{', '.join(repr(b) for b in BALANCE_BY)}."
        )


def _make_plan(
    graph: LayerGraph,
    starts: Sequence[int],
    devices: Sequence[str],
    *,
    balance_by: str,
    idle_devices: tuple[str, ...],
) -> PlacementPlan:
    cuts = graph.cut_bytes()
    bounds = list(starts) + [len(graph.layers)]
    stages = []
    for index, (start, end) in enumerate(zip(bounds, bounds[1:])):
        layers = graph.layers[start:end]
        stages.append(
            Stage(
                index=index,
                device=devices[index],
                layer_indices=tuple(range(start, end)),
                layers=tuple(layer.name for layer in layers),
                cost=math.fsum(layer.cost(balance_by) for layer in layers),
                params=sum(layer.params for layer in layers),
                param_bytes=sum(layer.param_bytes for layer in layers),
                output_bytes=cuts[end - 1] if end < len(graph.layers) else 0,
            )
        )
    return PlacementPlan(tuple(stages), balance_by, idle_devices)


def _balanced_starts(
    costs: Sequence[float], cut_bytes: Sequence[int], num_stages: int
) -> list[int]:
    """First layer index of each stage of the optimal partition (module docstring)."""
    n = len(costs)
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)

    def segment(p: int, i: int) -> float:  # cost of layers p..i-1
        return prefix[i] - prefix[p]

    # Phase 1: best[i] = smallest bottleneck of layers 0..i-1 in s stages.
    best = [math.inf] * (n + 1)
    for i in range(1, n + 1):
        best[i] = segment(0, i)
    for s in range(2, num_stages + 1):
        previous, best = best, [math.inf] * (n + 1)
        for i in range(s, n + 1):
            # p in [s-1, i-1]; previous[p] rises with p, segment(p, i) falls.
            low, high = s - 1, i - 1
            while low < high:
                middle = (low + high) // 2
                if previous[middle] >= segment(middle, i):
                    high = middle
                else:
                    low = middle + 1
            candidates = [low] + ([low - 1] if low - 1 >= s - 1 else [])
            best[i] = min(max(previous[p], segment(p, i)) for p in candidates)
    bottleneck = best[n]

    # Phase 2: fewest crossing bytes with every stage <= bottleneck.
    # crossing(p) = bytes on the cut before layer p (p >= 1).
    inf = math.inf
    total = [inf] * (n + 1)
    choice: list[list[int]] = [[-1] * (n + 1) for _ in range(num_stages + 1)]
    for i in range(1, n + 1):
        if segment(0, i) <= bottleneck:
            total[i] = 0.0
            choice[1][i] = 0
    for s in range(2, num_stages + 1):
        previous, total = total, [inf] * (n + 1)
        window: list[int] = []  # p candidates, increasing value, as a deque
        keys: list[float] = []
        head, low, next_p = 0, s - 1, s - 1
        for i in range(s, n + 1):
            while next_p <= i - 1:  # admit p = next_p
                value = previous[next_p] + cut_bytes[next_p - 1]
                while len(window) > head and keys[-1] >= value:
                    window.pop()
                    keys.pop()
                window.append(next_p)
                keys.append(value)
                next_p += 1
            while segment(low, i) > bottleneck:  # the window's left edge
                low += 1
            while head < len(window) and window[head] < low:
                head += 1
            if head < len(window) and keys[head] < inf:
                total[i] = keys[head]
                choice[s][i] = window[head]
    starts, end = [], n
    for s in range(num_stages, 0, -1):
        start = choice[s][end]
        starts.append(start)
        end = start
    starts.reverse()
    return starts

