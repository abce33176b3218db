"""Keras guide "Training & evaluation with the built-in methods" (`keras_io_examples.training_and_evaluation`) under one process's strategies.

TF's `MirroredStrategy` matched one device here too (weights and values
within 2.4e-7, both front ends, 2026-11-26); not run, as the slowest
contender.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.conformance import harness
from tests.conformance import keras_io_examples

pytestmark = [pytest.mark.model, pytest.mark.extended]


class TrainingAndEvaluationTest(keras_io_examples.OneProcessContenders, harness.ConformanceTestCase):
    EXAMPLE = "training_and_evaluation"


if __name__ == "__main__":
    tf.test.main()
