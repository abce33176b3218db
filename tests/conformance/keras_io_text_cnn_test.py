"""keras-io "Text classification from scratch" (`keras_io_examples.text_cnn`) under one process's strategies.

TF's `MirroredStrategy` runs it too: under Keras 3 the end-to-end model's
`evaluate` on raw strings fails in an `AddN` of strings (training and
evaluating on the vectorized dataset before it match one device); under
tf-keras it matches one device.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.conformance import harness
from tests.conformance import keras_io_examples

pytestmark = [pytest.mark.model, pytest.mark.extended]


class TextCnnTest(keras_io_examples.OneProcessContenders, harness.ConformanceTestCase):
    EXAMPLE = "text_cnn"
    CONTENDERS = keras_io_examples.OneProcessContenders.CONTENDERS + ("tf",)

    def test_tf_strategy_on_raw_strings(self):
        record, reference = self.records["tf"], self.records["one_device"]
        if harness.KERAS_3:
            self.assert_failed_with(record, "InvalidArgumentError", "node AddN")
            self.assertNotIn("end_to_end", record.values)
            self.assert_values_match(record, reference, ["loss", "val_loss", "evaluate"])
        else:
            self.assert_same_results(record, reference)


if __name__ == "__main__":
    tf.test.main()
