"""keras-io "Structured data classification from scratch" (`keras_io_examples.structured_data`) under one process's strategies.

242 training rows in batches of 32: each epoch ends with a batch of 18.
tfdist weighs it by its real rows, as one device does; TF's
`MirroredStrategy`, also run here, weighs its padded parts otherwise, and
its weights and losses move away from one device's (both front ends).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.conformance import harness
from tests.conformance import keras_io_examples

pytestmark = [pytest.mark.model, pytest.mark.extended]


class StructuredDataTest(keras_io_examples.OneProcessContenders, harness.ConformanceTestCase):
    EXAMPLE = "structured_data"
    CONTENDERS = keras_io_examples.OneProcessContenders.CONTENDERS + ("tf",)

    def test_tf_strategy_weighs_uneven_last_batches_otherwise(self):
        record, reference = self.records["tf"], self.records["one_device"]
        self.assert_ran(record)
        self.assertNotAllClose(record.values["loss"], reference.values["loss"],
                               rtol=harness.RTOL, atol=harness.ATOL)


if __name__ == "__main__":
    tf.test.main()
