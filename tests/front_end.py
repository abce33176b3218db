"""Which Keras `tf.keras` is in this test process: Keras 3, or tf-keras (`TF_USE_LEGACY_KERAS=1`).

TF's own rule; `make test` runs the model tests under each.
"""

import os

KERAS_3 = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() not in ("1", "true")
