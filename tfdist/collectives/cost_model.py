"""An alpha-beta cost model that picks the all-reduce algorithm per call.

A transfer step costs a fixed latency alpha (seconds) plus beta seconds per
byte. For n devices and a message of S bytes:

    ring:          T = 2(n-1) * alpha  +  2(n-1)/n * S * beta
    tree:          T = 2*ceil(log2 n) * (alpha + S * beta)
    reduce_to_one: T = 2 * alpha       +  2(n-1) * S * beta

(Reduce-to-one serialises n-1 receives and n-1 sends at the root.) Ring is
bandwidth-optimal and wins for large S; tree and reduce-to-one have fewer
steps and win for small S.

When only the first device's result is used (`reduce_only=True`; the
update-once path of `tfdist.MirroredStrategy` on host memory), the unused
broadcast half is pruned from the graph:

    ring:          unchanged (the root still gathers every chunk)
    tree:          T = ceil(log2 n) * (alpha + S * beta)
    reduce_to_one: T = alpha + (n-1) * S * beta

Calibration measures, on the actual devices, each algorithm's time at
several message sizes and solves its formula, between each pair of adjacent
sizes, for that algorithm's own alpha and beta (`T = steps * alpha +
factor * S * beta`); a message uses the constants of the size range it
falls in. Only the ranges that messages fall in are measured, each the
first time it is needed: a model whose buckets stay at or under 4 MiB never
times the 16 and 64 MiB messages, which cost most of a full calibration.
The process-wide model keeps its timings on disk (`calibration_cache`), so
only a machine's first run measures. Per-algorithm constants matter on hosts where "links" are memory
copies of very different cost (logical CPUs share one memory bus and
caches: time per byte differs across cache sizes there), and
reduce to the textbook model where links are real. `AlphaBeta` constants can also be given directly, which keeps tests
deterministic and lets a cluster ship measured numbers.

Packing. Bucketing k gradients into one buffer saves k-1 collectives (their
alpha terms) but costs a concat on every device and a split after, which
the model prices as its own `pack` constants (T_pack = alpha + S * beta,
calibrated like the algorithms). `should_pack` compares

    packed:    T_pack(S) + T_best(S)             S = sum of the k sizes
    separate:  sum_i T_best(S_i)

Between GPUs (or processes) alpha dominates and packing wins; between
logical CPUs of one process alpha is a few microseconds while a concat
moves every byte through the shared memory bus again, so it does not.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tfdist import errors
from tfdist.collectives import calibration_cache

__all__ = [
    "AlphaBeta",
    "CostModel",
    "default_cost_model",
    "predicted_time_s",
    "step_count",
    "byte_factor",
]

_ALGORITHMS = ("ring", "tree", "reduce_to_one")


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    """Latency per step and time per byte of one algorithm's transfers.

    Attributes:
      alpha_s: Seconds per communication step, >= 0.
      beta_s_per_byte: Seconds per byte moved, >= 0.
    """

    alpha_s: float
    beta_s_per_byte: float

    def __post_init__(self) -> None:
        for name in ("alpha_s", "beta_s_per_byte"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value >= 0):
                raise errors.ConfigError(
                    f"AlphaBeta.{name} must be a number >= 0; received "
                    f"{name}={value!r}. Pass measured seconds."
                )


def step_count(
    algorithm: str, num_devices: int, *, reduce_only: bool = False
) -> int:
    """Communication steps of `algorithm` on `num_devices` devices."""
    halve = 1 if reduce_only else 2
    if num_devices <= 1:
        return 0
    if algorithm == "ring":
        return 2 * (num_devices - 1)
    if algorithm == "tree":
        return halve * math.ceil(math.log2(num_devices))
    if algorithm == "reduce_to_one":
        return halve
    raise errors.ConfigError(
        f"Unknown all-reduce algorithm={algorithm!r}; expected one of "
        f"{_ALGORITHMS}."
    )


def byte_factor(
    algorithm: str, num_devices: int, *, reduce_only: bool = False
) -> float:
    """Multiple of the message size S on the critical path of `algorithm`."""
    n = num_devices
    halve = 1 if reduce_only else 2
    if n <= 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) / n
    if algorithm == "tree":
        return halve * math.ceil(math.log2(n))
    if algorithm == "reduce_to_one":
        return halve * (n - 1)
    raise errors.ConfigError(
        f"Unknown all-reduce algorithm={algorithm!r}; expected one of "
        f"{_ALGORITHMS}."
    )


def predicted_time_s(
    algorithm: str,
    num_devices: int,
    num_bytes: int,
    constants: AlphaBeta,
    *,
    reduce_only: bool = False,
) -> float:
    """The model's time for one all-reduce of `num_bytes` bytes."""
    return (
        step_count(algorithm, num_devices, reduce_only=reduce_only)
        * constants.alpha_s
        + byte_factor(algorithm, num_devices, reduce_only=reduce_only)
        * num_bytes
        * constants.beta_s_per_byte
    )


class CostModel:
    """Chooses the fastest algorithm for a message size on given devices.

    Holds one `AlphaBeta` per algorithm, either given or measured by
    `calibrate` (once per device set; later calls return the cached result).

    Example:
      >>> model = CostModel({"ring": AlphaBeta(1e-4, 1e-10),
      ...                    "tree": AlphaBeta(1e-4, 1e-10),
      ...                    "reduce_to_one": AlphaBeta(1e-4, 1e-10)})
      >>> model.choose(num_devices=4, num_bytes=64 << 20)
      'ring'
    """

    def __init__(
        self,
        constants: Mapping[str, AlphaBeta] | None = None,
        *,
        pack: AlphaBeta | None = None,
        cache: calibration_cache.CalibrationCache | None = None,
    ) -> None:
        """Creates a model from known constants, or an uncalibrated one.

        Args:
          constants: `AlphaBeta` per algorithm name ("ring", "tree",
            "reduce_to_one"); algorithms left out are never chosen. `None`
            means: measure on first use (`calibrate`).
          pack: Cost of packing a bucket (see the module docstring). With
            given `constants`, `None` means free packing (buckets always
            pay); with `constants=None` it is calibrated too.
          cache: Where calibration timings are read from and written to
            (`calibration_cache`); `None` measures in every process.

        Raises:
          ConfigError: If a key is not an algorithm name.
          TypeError: If `pack` is not an `AlphaBeta`.
        """
        if pack is not None and not isinstance(pack, AlphaBeta):
            raise TypeError(
                f"pack must be an AlphaBeta or None; received pack={pack!r}."
            )
        self._fixed_pack = pack
        self._fixed = dict(constants) if constants is not None else None
        if self._fixed is not None:
            for name in self._fixed:
                if name not in _ALGORITHMS:
                    raise errors.ConfigError(
                        f"CostModel constants name unknown algorithm "
                        f"{name!r}; expected keys from {_ALGORITHMS}."
                    )
            if not self._fixed:
                raise errors.ConfigError(
                    "CostModel constants={} is empty; give at least one "
                    f"algorithm from {_ALGORITHMS}, or None to calibrate."
                )
        # devices -> message size -> contender -> seconds (see `calibrate`).
        self._timings: dict[tuple[str, ...], dict[int, dict[str, float]]] = {}
        self._cache = cache

    def constants_for(
        self, devices: Sequence[str], num_bytes: int = 0
    ) -> Mapping[str, AlphaBeta]:
        """Per-algorithm constants for messages of `num_bytes` on `devices`.

        Calibrates the size range of `num_bytes` on first use per device set
        (later calls reuse the measurement).
        """
        if self._fixed is not None:
            return self._fixed
        segment = self._calibrated_segment(devices, num_bytes)
        return {name: value for name, value in segment.items() if name != _PACK}

    def _calibrated_segment(
        self, devices: Sequence[str], num_bytes: int
    ) -> dict[str, AlphaBeta]:
        """Every contender's constants for the size range holding `num_bytes`."""
        index = _segment_index(num_bytes)
        sizes = CALIBRATION_SIZES_BYTES[index : index + 2]
        timings = self._timings.get(tuple(devices))
        if timings is None:
            timings = self._timings[tuple(devices)] = self._load(devices)
        missing = [size for size in sizes if size not in timings]
        if missing:
            timings.update(calibrate(devices, sizes=missing))
            self._store(devices, timings)
        return {
            name: _fit(name, len(devices), sizes, [timings[size][name] for size in sizes])
            for name in timings[sizes[0]]
        }

    def _cache_path(self, devices: Sequence[str]) -> str | None:
        if self._cache is None:
            return None
        import tensorflow as tf  # Late: the formulas need no TensorFlow.

        kinds = [tf.DeviceSpec.from_string(d).device_type or "" for d in devices]
        return self._cache.path(devices, kinds)

    def _load(self, devices: Sequence[str]) -> dict[int, dict[str, float]]:
        path = self._cache_path(devices)
        return self._cache.load(path) if self._cache is not None and path else {}

    def _store(self, devices: Sequence[str], timings: dict[int, dict[str, float]]) -> None:
        path = self._cache_path(devices)
        if self._cache is not None and path:
            self._cache.store(path, timings)

    def choose(
        self,
        *,
        num_devices: int,
        num_bytes: int,
        devices: Sequence[str] | None = None,
        reduce_only: bool = False,
    ) -> str:
        """Returns the algorithm with the least predicted time.

        Args:
          num_devices: Devices taking part.
          num_bytes: Bytes per device in this all-reduce.
          devices: The devices, needed only when the model calibrates.
          reduce_only: Only the first device's result is used.
        """
        return self._best(num_devices, num_bytes, devices, reduce_only)[0]

    def pack_constants_for(
        self, devices: Sequence[str], num_bytes: int = 0
    ) -> AlphaBeta:
        """The cost of packing a `num_bytes` bucket on `devices`."""
        if self._fixed is not None or self._fixed_pack is not None:
            return self._fixed_pack or AlphaBeta(0.0, 0.0)
        return self._calibrated_segment(devices, num_bytes)[_PACK]

    def should_pack(
        self,
        *,
        num_devices: int,
        member_bytes: Sequence[int],
        devices: Sequence[str] | None = None,
        reduce_only: bool = False,
    ) -> bool:
        """Whether one collective over a packed bucket beats one per member.

        Args:
          num_devices: Devices taking part.
          member_bytes: Bytes per device of each tensor in the bucket.
          devices: The devices, needed only when the model calibrates.
          reduce_only: Only the first device's result is used.

        Returns:
          True when the predicted packed time (pack cost plus the best
          algorithm on the sum) is at most the sum of the members' best
          times; ties pack.
        """
        total = sum(member_bytes)
        pack = self.pack_constants_for(devices or (), total)
        packed = pack.alpha_s + total * pack.beta_s_per_byte + self._best(
            num_devices, total, devices, reduce_only
        )[1]
        separate = sum(
            self._best(num_devices, size, devices, reduce_only)[1]
            for size in member_bytes
        )
        return packed <= separate

    def _best(
        self,
        num_devices: int,
        num_bytes: int,
        devices: Sequence[str] | None,
        reduce_only: bool,
    ) -> tuple[str, float]:
        """(algorithm, predicted seconds) of the fastest algorithm."""
        constants = self.constants_for(devices or (), num_bytes)
        times = {
            name: predicted_time_s(
                name, num_devices, num_bytes, constants[name], reduce_only=reduce_only
            )
            for name in constants
        }
        best = min(times, key=times.__getitem__)
        return best, times[best]


_DEFAULT_MODEL: CostModel | None = None


def default_cost_model() -> CostModel:
    """The process-wide calibrating `CostModel` shared by all "auto" ops.

    Calibration measures the hardware, which does not change while the
    process runs (nor between runs), so every strategy built with
    `all_reduce="auto"` and no `cost_model` shares this one instance, each
    device set's size ranges are measured once per process, and the
    timings are kept in `calibration_cache.DEFAULT_DIRECTORY` for later
    processes on the same machine.
    """
    global _DEFAULT_MODEL
    if _DEFAULT_MODEL is None:
        _DEFAULT_MODEL = CostModel(cache=calibration_cache.CalibrationCache())
    return _DEFAULT_MODEL


#: Message sizes (bytes) timed by `calibrate`, from latency-bound to larger
#: than CPU caches, a factor of 4 apart (time per byte changes across cache
#: sizes). Each adjacent pair gives one (alpha, beta).
CALIBRATION_SIZES_BYTES = (64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
#: Each size is timed this many times and the fastest run kept: the minimum
#: is the estimate least disturbed by other work on the machine.
_CALIBRATION_REPEATS = 3
#: Key of the packing constants among the calibrated segments.
_PACK = "pack"
#: Tensors per bucket when timing packing.
_PACK_PIECES = 8


def calibrate(
    devices: Sequence[str], *, sizes: Sequence[int] = CALIBRATION_SIZES_BYTES
) -> dict[int, dict[str, float]]:
    """Times every algorithm, and packing, on `devices` at each of `sizes`.

    Runs eagerly (lifted out of any enclosing `tf.function` trace) and must
    be called where all `devices` are local; time grows with the size (the
    64 MiB messages cost most of a full calibration). The cost of calling a function with the same inputs and outputs is
    timed too and subtracted: it is paid once per step, not per
    collective.

    Returns:
      Per size (bytes per device), the seconds of each algorithm name and
      of "pack" (a concat of 8 pieces on every device): fastest of
      `_CALIBRATION_REPEATS` calls, call cost subtracted.
    """
    import tensorflow as tf  # Late: the formulas above need no TensorFlow.

    from tfdist.collectives import _algorithms

    def pack(xs):  # type: ignore[no-untyped-def]
        # A bucket of _PACK_PIECES tensors per device, concatenated. (The
        # split after is a view of the buffer when pieces are aligned.)
        outputs = []
        for pieces, device in zip(xs, devices):
            with tf.device(device):
                outputs.append(tf.concat(pieces, axis=0))
        return outputs

    def pass_through(xs):  # type: ignore[no-untyped-def]
        # Same inputs and outputs, no work: the cost of calling a function
        # over n devices, which is not part of any algorithm's time.
        outputs = []
        for x, device in zip(xs, devices):
            with tf.device(device):
                outputs.append(tf.identity(x[0] if isinstance(x, list) else x))
        return outputs

    def run_algorithm(name: str) -> Callable[[Any], Any]:
        algorithm = _algorithms.ALGORITHMS[name]
        return lambda xs: algorithm(xs, devices, None)

    contenders = {name: run_algorithm(name) for name in _algorithms.ALGORITHMS}
    contenders[_PACK] = pack
    result: dict[int, dict[str, float]] = {}
    with tf.init_scope():
        for num_bytes in sizes:
            inputs = {
                packed: _inputs(devices, num_bytes, packed=packed)
                for packed in (False, True)
            }
            call_cost = {
                packed: _fastest_s(pass_through, inputs[packed])
                for packed in (False, True)
            }
            result[num_bytes] = {
                name: max(
                    _fastest_s(body, inputs[name == _PACK]) - call_cost[name == _PACK],
                    0.0,
                )
                for name, body in contenders.items()
            }
    return result


def _inputs(devices: Sequence[str], num_bytes: int, *, packed: bool) -> list:  # type: ignore[type-arg]
    """One float32 message of `num_bytes` per device (in pieces if packed)."""
    import tensorflow as tf

    length = num_bytes // 4
    inputs = []
    for device in devices:
        with tf.device(device):
            if packed:
                piece = tf.ones([length // _PACK_PIECES], tf.float32)
                inputs.append([piece] * _PACK_PIECES)
            else:
                inputs.append(tf.ones([length], tf.float32))
    return inputs


def _fastest_s(body, inputs) -> float:  # type: ignore[no-untyped-def]
    """Fastest of `_CALIBRATION_REPEATS` timed calls of `tf.function(body)`."""
    import tensorflow as tf

    run = tf.function(body)
    run(inputs)  # Trace and warm up.
    fastest = float("inf")
    for _ in range(_CALIBRATION_REPEATS):
        start = time.perf_counter()
        outputs = run(inputs)
        outputs[-1].numpy()  # Wait for the last device's result.
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def _segment_index(num_bytes: int) -> int:
    """Which pair of adjacent calibration sizes holds `num_bytes`.

    Pair i is `CALIBRATION_SIZES_BYTES[i : i + 2]`; the first pair also
    covers smaller messages, the last larger ones.
    """
    for index, upper in enumerate(CALIBRATION_SIZES_BYTES[1:-1]):
        if num_bytes <= upper:
            return index
    return len(CALIBRATION_SIZES_BYTES) - 2


def _fit(
    algorithm: str,
    num_devices: int,
    sizes: Sequence[int],
    timings: Sequence[float],
) -> AlphaBeta:
    """Solves T = steps*alpha + factor*S*beta from two (size, time) points."""
    (small, large), (t_small, t_large) = sizes, timings
    if algorithm == _PACK:
        factor, steps = 1.0, 1
    else:
        factor = byte_factor(algorithm, num_devices)
        steps = step_count(algorithm, num_devices)
    if factor == 0 or steps == 0:
        return AlphaBeta(0.0, 0.0)
    beta = max(t_large - t_small, 0.0) / (factor * (large - small))
    alpha = max(t_small - factor * small * beta, 0.0) / steps
    return AlphaBeta(alpha, beta)
