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
falls in. Per-algorithm constants matter on hosts where "links" are memory
copies of very different cost (logical CPUs share one memory bus and
caches: time per byte at 4 MiB and at 64 MiB differ by 2x there), and
reduce to the textbook model where links are real. `AlphaBeta` constants can also be given directly, which keeps tests
deterministic and lets a cluster ship measured numbers.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence

from tfdist import errors

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

    def __init__(self, constants: Mapping[str, AlphaBeta] | None = None) -> None:
        """Creates a model from known constants, or an uncalibrated one.

        Args:
          constants: `AlphaBeta` per algorithm name ("ring", "tree",
            "reduce_to_one"); algorithms left out are never chosen. `None`
            means: measure on first use (`calibrate`).

        Raises:
          ConfigError: If a key is not an algorithm name.
        """
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
        self._calibrated: dict[
            tuple[str, ...], dict[str, tuple[AlphaBeta, ...]]
        ] = {}

    def constants_for(
        self, devices: Sequence[str], num_bytes: int = 0
    ) -> Mapping[str, AlphaBeta]:
        """Per-algorithm constants for messages of `num_bytes` on `devices`.

        Calibrates once per device set (later calls reuse the measurement).
        """
        if self._fixed is not None:
            return self._fixed
        key = tuple(devices)
        if key not in self._calibrated:
            self._calibrated[key] = calibrate(devices)
        return {
            name: _segment_for(segments, num_bytes)
            for name, segments in self._calibrated[key].items()
        }

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
        constants = self.constants_for(devices or (), num_bytes)
        return min(
            constants,
            key=lambda name: predicted_time_s(
                name,
                num_devices,
                num_bytes,
                constants[name],
                reduce_only=reduce_only,
            ),
        )


_DEFAULT_MODEL: CostModel | None = None


def default_cost_model() -> CostModel:
    """The process-wide calibrating `CostModel` shared by all "auto" ops.

    Calibration measures the hardware, which does not change while the
    process runs, so every strategy built with `all_reduce="auto"` and no
    `cost_model` shares this one instance and each device set is measured
    once per process (a few seconds), not once per strategy.
    """
    global _DEFAULT_MODEL
    if _DEFAULT_MODEL is None:
        _DEFAULT_MODEL = CostModel()
    return _DEFAULT_MODEL


#: Message sizes (bytes) timed by `calibrate`, from latency-bound to larger
#: than CPU caches, a factor of 4 apart (time per byte changes across cache
#: sizes). Each adjacent pair gives one (alpha, beta).
CALIBRATION_SIZES_BYTES = (64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
#: Each size is timed this many times and the fastest run kept: the minimum
#: is the estimate least disturbed by other work on the machine.
_CALIBRATION_REPEATS = 5


def calibrate(devices: Sequence[str]) -> dict[str, tuple[AlphaBeta, ...]]:
    """Measures every algorithm on `devices` and fits its alpha and beta.

    Runs eagerly (lifted out of any enclosing `tf.function` trace), takes
    a few seconds, and must be called where all `devices` are local.

    Returns:
      Per algorithm name, one `AlphaBeta` per pair of adjacent
      `CALIBRATION_SIZES_BYTES` (the first also covers smaller messages,
      the last larger ones).
    """
    import tensorflow as tf  # Late: the formulas above need no TensorFlow.

    from tfdist.collectives import _algorithms

    n = len(devices)
    result: dict[str, tuple[AlphaBeta, ...]] = {}
    with tf.init_scope():
        for name, algorithm in _algorithms.ALGORITHMS.items():
            timings = []
            for num_bytes in CALIBRATION_SIZES_BYTES:
                length = num_bytes // 4
                inputs = []
                for device in devices:
                    with tf.device(device):
                        inputs.append(tf.ones([length], tf.float32))

                @tf.function
                def run(xs, algorithm=algorithm):  # type: ignore[no-untyped-def]
                    return algorithm(xs, devices, None)

                run(inputs)  # Trace and warm up.
                fastest = float("inf")
                for _ in range(_CALIBRATION_REPEATS):
                    start = time.perf_counter()
                    outputs = run(inputs)
                    outputs[-1].numpy()  # Wait for the last device's result.
                    fastest = min(fastest, time.perf_counter() - start)
                timings.append(fastest)
            result[name] = tuple(
                _fit(
                    name,
                    n,
                    CALIBRATION_SIZES_BYTES[i : i + 2],
                    timings[i : i + 2],
                )
                for i in range(len(timings) - 1)
            )
    return result


def _segment_for(segments: Sequence[AlphaBeta], num_bytes: int) -> AlphaBeta:
    """The constants fitted for the size range holding `num_bytes`."""
    for upper, constants in zip(CALIBRATION_SIZES_BYTES[1:], segments):
        if num_bytes <= upper:
            return constants
    return segments[-1]


def _fit(
    algorithm: str,
    num_devices: int,
    sizes: Sequence[int],
    timings: Sequence[float],
) -> AlphaBeta:
    """Solves T = steps*alpha + factor*S*beta from two (size, time) points."""
    (small, large), (t_small, t_large) = sizes, timings
    factor = byte_factor(algorithm, num_devices)
    steps = step_count(algorithm, num_devices)
    if factor == 0 or steps == 0:
        return AlphaBeta(0.0, 0.0)
    beta = max(t_large - t_small, 0.0) / (factor * (large - small))
    alpha = max(t_small - factor * small * beta, 0.0) / steps
    return AlphaBeta(alpha, beta)
