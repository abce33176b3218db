"""Local devices: discover accelerators, or simulate several CPUs.

`local_devices()` answers "which devices should one replica each run on",
preferring TPU over GPU over CPU. `simulate_cpu_devices(n)` splits the host
CPU into `n` logical devices so that multi-device code runs, and is tested,
on a machine without accelerators.

Logical devices can only be configured before TensorFlow initialises its
runtime (the first op, `list_logical_devices`, or strategy construction).
Call `simulate_cpu_devices` at the top of a program or test process.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist import errors
from tfdist._internal import validation

__all__ = ["local_devices", "simulate_cpu_devices"]

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


def _canonical(name: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' -> '/device:CPU:1'."""
    return "/device:" + name.rsplit("/device:", 1)[-1]
