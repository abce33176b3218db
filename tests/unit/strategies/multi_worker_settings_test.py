"""MultiWorkerMirroredStrategy's reading of TF's CommunicationOptions.

The options are built the way TF's guides write them
(`tf.distribute.experimental.CommunicationOptions(...)`), which returns an
instance of a class other than the exported name.
"""

from __future__ import annotations

import tensorflow as tf

from tfdist import errors
from tfdist.collectives import cross_device_ops
from tfdist.multi_worker import strategy as multi_worker

Implementation = tf.distribute.experimental.CommunicationImplementation


def _options(**kwargs):
    return tf.distribute.experimental.CommunicationOptions(**kwargs)


class CommunicationSettingsTest(tf.test.TestCase):

    def test_tf_options_give_timeout_pack_size_and_implementation(self):
        timeout_s, bucket_bytes, implementation = multi_worker._communication_settings(
            _options(timeout_seconds=60, bytes_per_pack=1 << 20,
                     implementation=Implementation.RING),
            None, cross_device_ops.DEFAULT_BUCKET_BYTES)
        self.assertEqual((timeout_s, bucket_bytes, implementation),
                         (60, 1 << 20, Implementation.RING))

    def test_auto_implementation_becomes_ring_and_default_timeout_holds(self):
        timeout_s, _, implementation = multi_worker._communication_settings(
            _options(), None, cross_device_ops.DEFAULT_BUCKET_BYTES)
        self.assertEqual(implementation, Implementation.RING)
        self.assertEqual(timeout_s, multi_worker.DEFAULT_TIMEOUT_S)

    def test_timeout_given_twice_differently_is_a_config_error(self):
        with self.assertRaisesRegex(errors.ConfigError, r"timeout_s=20.*timeout_seconds=60"):
            multi_worker._communication_settings(
                _options(timeout_seconds=60), 20, cross_device_ops.DEFAULT_BUCKET_BYTES)

    def test_something_else_is_a_type_error_naming_it(self):
        with self.assertRaisesRegex(TypeError, r"CommunicationOptions.*dict"):
            multi_worker._communication_settings(
                {"timeout_seconds": 60}, None, cross_device_ops.DEFAULT_BUCKET_BYTES)


if __name__ == "__main__":
    tf.test.main()
