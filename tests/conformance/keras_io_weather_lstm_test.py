"""keras-io "Timeseries forecasting for weather prediction" (`keras_io_examples.weather_lstm`) under one process's strategies.

TF's `MirroredStrategy` matched one device here too (weights and values
within 2.4e-7, both front ends, 2026-11-26); not run, as the slowest
contender (each of its 4 replicas traces the LSTM apart).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests.conformance import harness
from tests.conformance import keras_io_examples

pytestmark = [pytest.mark.model, pytest.mark.extended]


class WeatherLstmTest(keras_io_examples.OneProcessContenders, harness.ConformanceTestCase):
    EXAMPLE = "weather_lstm"


if __name__ == "__main__":
    tf.test.main()
