"""Logical-device set-up for test processes."""

from __future__ import annotations

from tfdist import devices

#: Logical CPUs every tfdist test process gets (tests/conftest.py).
DEFAULT_NUM_LOGICAL_CPUS = 4


def use_logical_cpus(num_devices: int = DEFAULT_NUM_LOGICAL_CPUS) -> None:
    """Gives this process `num_devices` logical CPUs; call before TF starts.

    Raises:
      DeviceConfigError: If TensorFlow already runs with another count.
    """
    devices.simulate_cpu_devices(num_devices)


def main(num_devices: int = DEFAULT_NUM_LOGICAL_CPUS) -> None:
    """Entry point for a test file run directly: logical CPUs, then absltest.

    Use as `if __name__ == "__main__": tfdist.testing.main()`.
    """
    from absl.testing import absltest  # Imported late: only test runs need it.

    use_logical_cpus(num_devices)
    absltest.main()
