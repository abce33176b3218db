"""tfdist's input path leaves glibc's allocator settings alone; TF's does not.

Creating a tf.data GeneratorDataset makes TensorFlow call
`mallopt(M_TRIM_THRESHOLD, 128 KiB)` for the whole process, logged once as
"Memory patch applied"; from then on every tensor over 128 KiB is faulted
in anew at each allocation (benchmarks/RESULTS.md). TF's MirroredStrategy
creates one per device for its MultiDeviceIterator; tfdist reads input on
the host with a plain iterator and creates none. Each run is a fresh
process: the setting is process-wide and logged once.
"""

from __future__ import annotations

import os
import sys
import textwrap

import tensorflow as tf

import tfdist
from tests import forked_script

_FIT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tfdist
    devices = tfdist.simulate_cpu_devices(4)
    import tensorflow as tf
    strategy = (tfdist.MirroredStrategy(devices) if sys.argv[1] == "tfdist"
                else tf.distribute.MirroredStrategy(list(devices)))
    with strategy.scope():
        model = tfdist.testing.small_classifier(tf.keras.optimizers.SGD(0.1))
    x = np.zeros((64, 8), np.float32)
    y = np.zeros((64,), np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64).batch(16)
    model.fit(dataset, epochs=2, verbose=0)
    print("FIT DONE")
    """
)

_PATCH_LOG = "Memory patch applied"


class HostInputTest(tf.test.TestCase):
    def _fit_log(self, contender: str) -> str:
        # A fresh process each (forked from one that imported TensorFlow,
        # before anything ran: tests/forked_script.py).
        script = self.create_tempfile("fit.py", content=_FIT).full_path
        result = forked_script.run(
            [sys.executable, script, contender], os.environ, cwd=os.getcwd(), timeout_s=180)
        self.assertIn("FIT DONE", result.stdout, result.stderr[-2000:])
        return result.stderr

    def test_tfdist_fit_leaves_the_trim_threshold_alone(self):
        self.assertNotIn(_PATCH_LOG, self._fit_log("tfdist"))

    def test_tf_mirrored_strategy_sets_it(self):
        # The control: the log line this file looks for is what TF prints.
        self.assertIn(_PATCH_LOG, self._fit_log("tf"))


if __name__ == "__main__":
    tfdist.testing.main()
