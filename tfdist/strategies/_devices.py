"""Validation of the device lists strategies are given."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tfdist import devices as devices_lib
from tfdist import errors


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
      devices: Device names, or `None` for all local accelerators (else all
        logical CPUs).

    Returns:
      Canonical device names, in the order given.

    Raises:
      TypeError: If `devices` is a string or holds non-strings.
      DeviceConfigError: If it is empty, has duplicates, or names devices
        this process does not have.
    """
    if devices is None:
        return devices_lib.local_devices()
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
    available = {
        canonical_device(d.name.rsplit("/device:", 1)[-1])
        for d in tf.config.list_logical_devices()
    }
    missing = [d for d in names if _local_part(d) not in available]
    if missing:
        raise errors.DeviceConfigError(
            f"devices={list(devices)!r} names {missing}, which this process "
            f"does not have. Available: {sorted(available)}. To simulate CPUs "
            "call tfdist.simulate_cpu_devices(n) before TensorFlow starts."
        )
    return tuple(names)


def _local_part(device: str) -> str:
    return "/device:" + device.rsplit("/device:", 1)[-1]
