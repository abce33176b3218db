"""keras-io examples (`keras_io_examples.py`) under synchronous parameter-server training.

One task process (forked by `run_local_cluster`) starts an in-process
cluster of 2 workers and 2 ps tasks, and runs every example twice from the
same seed: without a strategy, and under `tfdist.ParameterServerStrategy(
mode="sync")`, whose workers each compute half of every global batch.

The text example's table (20000 x 32 float32, 2.56 MB) is split over both
ps tasks. Where the strategies part:

- Keras 3's sparse Adam squares each row of an embedding gradient before
  adding an index's rows; sync mode hands it every worker's rows (it
  summed them before, and the table trained elsewhere than on one device).
- tf-keras lists a split table's shards as separate weights; tfdist's
  `get_weights()` returns the table whole, as one device's.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest
import tensorflow as tf
from absl.testing import parameterized

import tfdist
from tests.conformance import harness
from tests.conformance import keras_io_examples

pytestmark = [pytest.mark.model, pytest.mark.multiprocess, pytest.mark.extended]
keras = tf.keras


def run_examples() -> dict[tuple[str, str], object]:
    """In the task: every example without a strategy and under sync parameter-server training.

    Returns records by (example, contender), and the warnings logged during
    each example's sync run by (example, "warnings").
    """
    config = tfdist.testing.start_local_ps_cluster(num_workers=2, num_ps=2)
    strategies = {
        # No strategy: after the in-process servers start, this process's
        # devices are the chief's, which `OneDeviceStrategy("/cpu:0")` is not.
        "one_device": tf.distribute.get_strategy(),
        "tfdist_ps_sync": tfdist.ParameterServerStrategy(config, mode="sync", timeout_s=120),
    }
    records = {}
    for example, port in keras_io_examples.EXAMPLES.items():
        for contender, strategy in strategies.items():
            workdir = tempfile.mkdtemp(prefix=f"{example}_{contender}_")
            keras.utils.set_random_seed(harness.SEED)
            try:
                with harness.absl_warnings() as warnings:
                    records[example, contender] = harness.keeps_partial_results(
                        lambda c, w, record: port(strategy, w, record)
                    )(contender, workdir)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        records[example, "warnings"] = warnings
    return records


class KerasIoExamplesParameterServerTest(harness.ConformanceTestCase, parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        (cls.records,) = tfdist.testing.run_local_cluster(
            run_examples, num_workers=1, timeout_s=harness.CLUSTER_TIMEOUT_S
        )

    def assert_matches_one_device(self, example):
        record, reference = (self.records[example, c] for c in ("tfdist_ps_sync", "one_device"))
        self.assert_ran(record)
        self.assert_same_results(record, reference)

    @parameterized.parameters(
        "text_cnn", "weather_lstm", "structured_data", "training_and_evaluation"
    )
    def test_sync_matches_one_device(self, example):
        self.assert_matches_one_device(example)
        self.assertEqual(self.records[example, "warnings"], [])


if __name__ == "__main__":
    tfdist.testing.main()
