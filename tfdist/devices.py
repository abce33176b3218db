"""Local devices: discover accelerators, or simulate several CPUs.

`local_devices()` answers "which devices should one replica each run on",
preferring TPU over GPU over CPU; `resolve_local_devices` validates a
strategy's own device list against them. `simulate_cpu_devices(n)` splits the host
CPU into `n` logical devices so that multi-device code runs, and is tested,
on a machine without accelerators.

Logical devices can only be configured before TensorFlow initialises its
runtime (the first op, `list_logical_devices`, or strategy construction).
Call `simulate_cpu_devices` at the top of a program or test process.
"""

from __future__ import annotations

import tensorflow as tf

from collections.abc import Sequence

from tfdist import errors
from tfdist import _validation as validation

__all__ = [
    "canonical_device",
    "local_devices",
    "resolve_local_devices",
    "share_host_memory",
    "simulate_cpu_devices",
]

_ACCELERATOR_TYPES = ("TPU", "GPU")


def local_devices() -> tuple[str, ...]:
    """Returns the names of this process's devices of the preferred type.

    TPUs are preferred over GPUs, GPUs over CPUs; within a type, all logical
    devices are returned in index order, for example
    `("/device:GPU:0", "/device:GPU:1")`. On a machine without accelerators
    this is every logical CPU, so after `simulate_cpu_devices(4)` it returns
    four CPU devices.

    Initialises the TensorFlow runtime if it is not yet initialised.
    """
    for device_type in (*_ACCELERATOR_TYPES, "CPU"):
        found = tf.config.list_logical_devices(device_type)
        if found:
            return tuple(_canonical(d.name) for d in found)
    raise errors.DeviceConfigError(  # pragma: no cover - TF always has a CPU
        "TensorFlow reports no TPU, GPU or CPU devices; received none. "
        "Check the TensorFlow installation."
    )


def simulate_cpu_devices(num_devices: int) -> tuple[str, ...]:
    """Configures `num_devices` logical CPU devices and returns their names.

    Must be called before the TensorFlow runtime is initialised. Calling it
    again with the same count (even after initialisation) is a no-op, so a
    test harness and a test may both call it.

    Args:
      num_devices: Number of logical CPUs, >= 1.

    Returns:
      `("/device:CPU:0", ..., f"/device:CPU:{num_devices - 1}")`.

    Raises:
      TypeError: If `num_devices` is not an int.
      DeviceConfigError: If `num_devices` < 1, or if the runtime is already
        initialised with a different number of logical CPUs.
    """
    validation.check_positive_int(
        "num_devices", num_devices, error=errors.DeviceConfigError
    )
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu,
            [tf.config.LogicalDeviceConfiguration()] * num_devices,
        )
    except RuntimeError as e:
        current = len(tf.config.list_logical_devices("CPU"))
        if current != num_devices:
            raise errors.DeviceConfigError(
                "TensorFlow is already initialised with "
                f"{current} logical CPU device(s); received "
                f"num_devices={num_devices}. Logical devices can only be set "
                "before the first TensorFlow op runs: call "
                "tfdist.simulate_cpu_devices() at the start of the program, "
                "before building models or strategies."
            ) from e
    return tuple(f"/device:CPU:{i}" for i in range(num_devices))


def canonical_device(name: object) -> str:
    """'/cpu:1' or 'CPU:1' -> '/device:CPU:1'; job/task parts are kept.

    Raises:
      TypeError: If `name` is not a string.
      DeviceConfigError: If `name` does not parse as a device.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"device names must be strings; received {name!r} of type "
            f"{type(name).__name__}."
        )
    text = name if name.startswith("/") else "/" + name
    try:
        spec = tf.DeviceSpec.from_string(text)
    except ValueError as e:
        raise errors.DeviceConfigError(
            f"device={name!r} is not a device name. Expected e.g. '/gpu:0' "
            "or '/device:CPU:1'."
        ) from e
    if spec.device_type is None or spec.device_index is None:
        raise errors.DeviceConfigError(
            f"device={name!r} names no device type and index. Expected e.g. "
            "'/gpu:0' or '/device:CPU:1'."
        )
    return spec.to_string()


def resolve_local_devices(devices: Sequence[str] | None) -> tuple[str, ...]:
    """Validates a strategy's `devices` argument, or picks the defaults.

    Syntax and duplicates are checked before anything touches the TF
    runtime; existence is checked last (it initialises the runtime).

    Args:
      devices: Device names, or `None` for `local_devices()`.

    Returns:
      Canonical device names, in the order given.

    Raises:
      TypeError: If `devices` is a string or holds non-strings.
      DeviceConfigError: If it is empty, has duplicates, or names devices
        this process does not have.
    """
    if devices is None:
        return local_devices()
    if isinstance(devices, str):
        raise TypeError(
            f"devices must be a sequence of device names; received the string "
            f"devices={devices!r}. Wrap it in a list: devices=[{devices!r}]."
        )
    names = [canonical_device(d) for d in devices]
    if not names:
        raise errors.DeviceConfigError(
            "devices=[] is empty. Pass at least one device, or devices=None "
            "for every local accelerator (else every logical CPU)."
        )
    duplicates = sorted({d for d in names if names.count(d) > 1})
    if duplicates:
        raise errors.DeviceConfigError(
            f"devices={list(devices)!r} lists {duplicates} more than once. "
            "Give each device once; one replica runs per device."
        )
    available = {_canonical(d.name) for d in tf.config.list_logical_devices()}
    missing = [d for d in names if _canonical(d) not in available]
    if missing:
        raise errors.DeviceConfigError(
            f"devices={list(devices)!r} names {missing}, which this process "
            f"does not have. Available: {sorted(available)}. To simulate CPUs "
            "call tfdist.simulate_cpu_devices(n) before TensorFlow starts."
        )
    return tuple(names)


def share_host_memory(devices: Sequence[str]) -> bool:
    """Whether every device is a CPU of this process (one memory system).

    Tensors pass between such devices by reference, and the devices share
    the same cores and memory bus, so strategies over them can skip work
    that only pays off between separate memories (per-device copies,
    prefetching to devices).

    Args:
      devices: Canonical device names (as `resolve_local_devices` returns).
    """
    return all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices)


def _canonical(name: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' -> '/device:CPU:1'."""
    return "/device:" + name.rsplit("/device:", 1)[-1]
