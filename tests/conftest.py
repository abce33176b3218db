"""Test-process set-up shared by every tier.

- 4 logical CPUs before TensorFlow starts (CONTRIBUTING.md, "Tests").
- absl flags marked parsed, so absltest helpers such as `create_tempdir`
  work under pytest as they do under `python file.py`.
- Every test under tests/conformance/ marked `conformance`, so one pytest
  run can select the tier by marker (`make test-tfkeras`).
"""

import pytest
from absl import flags

from tfdist.testing import use_logical_cpus

use_logical_cpus(4)
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def pytest_collection_modifyitems(config, items):
    del config
    for item in items:
        if item.path.parent.name == "conformance":
            item.add_marker(pytest.mark.conformance)
