"""Which Keras `tf.keras` is in this test process: Keras 3, or tf-keras (`TF_USE_LEGACY_KERAS=1`).

TF's own rule; `make test` runs the model tests under each.
"""

import os

KERAS_3 = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() not in ("1", "true")

#: Whether this run includes TF's own strategies as contenders. `make test`
#: (CI) leaves them out (TFDIST_TEST_TF_CONTENDER=0): they check TensorFlow's
#: behaviour, not tfdist's, and they are the costliest runs (TF's
#: MirroredStrategy traces each replica apart); `make test-all` and a plain
#: `pytest` run them (CONTRIBUTING.md, "CI").
TF_CONTENDER = os.environ.get("TFDIST_TEST_TF_CONTENDER", "1") != "0"

