"""Calibration timings kept on disk, so a machine is measured once, not every run.

Calibrating the cost model times every algorithm on the actual devices
(`cost_model.calibrate`); on logical CPUs that is a second or two at a
model's first step. The hardware does not change between runs, so the
timings are stored in a JSON file keyed by what they depend on: the
devices (names and kinds), the host's processor model and core count, and
the TensorFlow version. A later process on the same machine reads them
instead of measuring.

Contract: reads and writes are best effort: an unreadable or corrupt file
is ignored (the sizes are measured again) and a write that fails is
skipped. Concurrent processes may both measure; the last write wins.
Delete the directory (default `~/.cache/tfdist`) to measure again, e.g.
after measuring on a loaded machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Mapping, Sequence

__all__ = ["CalibrationCache", "DEFAULT_DIRECTORY"]

#: Where `default_cost_model()` keeps its timings.
DEFAULT_DIRECTORY = os.path.join(os.path.expanduser("~"), ".cache", "tfdist")

Timings = dict[int, dict[str, float]]  # message bytes -> contender -> seconds


def _processor() -> str:
    """The host's processor model, as /proc/cpuinfo names it (or platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CalibrationCache:
    """Calibration timings of device sets, in one JSON file per device set.

    Args:
      directory: Where the files live (created on first write).
    """

    def __init__(self, directory: str = DEFAULT_DIRECTORY) -> None:
        self.directory = directory

    def path(self, devices: Sequence[str], device_kinds: Sequence[str]) -> str:
        """The file for `devices` (with their kinds, e.g. "CPU") on this host."""
        import tensorflow as tf  # Late: only for the version in the key.

        key = json.dumps(
            {
                "devices": list(devices),
                "kinds": list(device_kinds),
                "processor": _processor(),
                "cores": os.cpu_count(),
                "tensorflow": tf.__version__,
            },
            sort_keys=True,
        )
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return os.path.join(self.directory, f"calibration-{digest}.json")

    def load(self, path: str) -> Timings:
        """The timings stored at `path`; empty if none or unreadable."""
        try:
            with open(path, encoding="utf-8") as f:
                stored = json.load(f)
            return {
                int(size): {name: float(t) for name, t in timings.items()}
                for size, timings in stored.items()
            }
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def store(self, path: str, timings: Mapping[int, Mapping[str, float]]) -> None:
        """Writes `timings` to `path` atomically (best effort)."""
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({str(k): dict(v) for k, v in timings.items()}, f)
            os.replace(tmp, path)
        except OSError:
            pass
