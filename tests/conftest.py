"""Test-process set-up shared by every tier.

- 4 logical CPUs before TensorFlow starts (CONTRIBUTING.md, "Tests").
- One thread per op (`TFDIST_TEST_INTRA_OP_THREADS`, default 1): the test
  processes run side by side on 2 cores (`PYTEST_JOBS`), and each op's own
  thread pool would only oversubscribe them. Every contender of a test runs
  in its process, with the same setting.
- absl flags marked parsed, so absltest helpers such as `create_tempdir`
  work under pytest as they do under `python file.py`.
- Every test under tests/conformance/ marked `conformance`, so one pytest
  run can select the tier by marker (`make test-tfkeras`).
"""

import os

import pytest
import tensorflow as tf
from absl import flags

from tfdist.testing import use_logical_cpus

use_logical_cpus(4)
tf.config.threading.set_intra_op_parallelism_threads(
    int(os.environ.get("TFDIST_TEST_INTRA_OP_THREADS", "1"))
)
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def pytest_collection_modifyitems(config, items):
    del config
    for item in items:
        if item.path.parent.name == "conformance":
            item.add_marker(pytest.mark.conformance)
