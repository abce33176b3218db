"""tfdist.devices: discovery and simulated CPUs (the process has 4 logical CPUs)."""

from __future__ import annotations

from absl.testing import parameterized
import tensorflow as tf

import tfdist
from tfdist import errors


class SimulateCpuDevicesTest(tf.test.TestCase, parameterized.TestCase):

    def test_same_count_after_initialisation_is_a_no_op_returning_names(self):
        self.assertEqual(
            tfdist.simulate_cpu_devices(4),
            tuple(f"/device:CPU:{i}" for i in range(4)),
        )

    def test_different_count_after_initialisation_raises_config_error(self):
        tf.config.list_logical_devices("CPU")  # Initialises the runtime, whatever ran before.
        with self.assertRaisesRegex(
            errors.ConfigError,
            r"already initialised with 4 logical CPU.*num_devices=2.*before",
        ) as raised:
            tfdist.simulate_cpu_devices(2)
        self.assertIsInstance(raised.exception, errors.DeviceConfigError)
        self.assertIsInstance(raised.exception.__cause__, RuntimeError)

    @parameterized.named_parameters(
        {"testcase_name": "zero", "value": 0}, {"testcase_name": "negative", "value": -3}
    )
    def test_non_positive_count_raises_config_error(self, value):
        with self.assertRaisesRegex(errors.DeviceConfigError, f"num_devices={value}"):
            tfdist.simulate_cpu_devices(value)

    @parameterized.named_parameters(
        {"testcase_name": "float", "value": 2.0},
        {"testcase_name": "bool", "value": True},
        {"testcase_name": "string", "value": "4"},
    )
    def test_non_int_count_raises_type_error(self, value):
        with self.assertRaisesRegex(TypeError, "num_devices"):
            tfdist.simulate_cpu_devices(value)


class LocalDevicesTest(tf.test.TestCase):

    def test_without_accelerators_returns_every_logical_cpu_in_order(self):
        self.assertEqual(
            tfdist.local_devices(), tuple(f"/device:CPU:{i}" for i in range(4))
        )


if __name__ == "__main__":
    tfdist.testing.main()
