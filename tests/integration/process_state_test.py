"""tfdist changes no TF or Keras class or module beyond the strategy, scope or call that needs it.

A child process (`process_state_script.py`) snapshots the attributes of
the TF and Keras classes and modules tfdist touches (or might: the
strategies' bases, Keras's layers, models, trainers, callbacks and
optimizers, tf-keras's weight files), trains under every tfdist strategy
that runs in one process, the parameter-server one with split variables,
and compares the snapshot after each `fit`, each `strategy.run` and each
weights round trip, and once the strategies are dropped. Then, in the
same process, plain Keras (a second model with checkpoint callbacks, a
`GradientTape` step, weight files) must give exactly what it gives in a
process that never imported tfdist. Under Keras 3 and tf-keras.

Python itself adds one entry to a class's `__dict__` on first read of its
`__annotations__` (an empty dict); that is not a change of behaviour and
is not counted.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
import pytest

from tests import forked_script
from tests.integration import process_state_script

pytestmark = pytest.mark.multiprocess

_SCRIPT = os.path.abspath(process_state_script.__file__)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_SCRIPT)))
_TIMEOUT_S = 240


class ProcessStateTest(parameterized.TestCase):

    def _run(self, mode: str, tf_keras: bool) -> dict:
        workdir = self.create_tempdir().full_path
        out = os.path.join(workdir, "out.json")
        env = dict(os.environ, TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="3", PYTHONPATH=os.pathsep.join(
            filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
        env.pop("TF_USE_LEGACY_KERAS", None)
        if tf_keras:
            env["TF_USE_LEGACY_KERAS"] = "1"
        result = forked_script.run(
            [sys.executable, _SCRIPT, mode, out, workdir], env, cwd=_ROOT, timeout_s=_TIMEOUT_S)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        with open(out) as f:
            return json.load(f)

    @parameterized.named_parameters(("keras3", False), ("tf_keras", True))
    def test_tf_and_keras_are_as_tfdist_found_them_and_plain_keras_trains_as_without_it(
        self, tf_keras
    ):
        after_tfdist = self._run("tfdist", tf_keras)
        without_tfdist = self._run("plain", tf_keras)
        changed = [c for c in after_tfdist["changed"] if "__annotations__" not in c]
        self.assertEmpty(changed)
        plain, reference = after_tfdist["plain"], without_tfdist["plain"]
        self.assertEqual(plain["files"], reference["files"])
        for key in ("loss", "weights", "gradients", "reloaded"):
            for got, expected in zip(plain[key], reference[key], strict=True):
                np.testing.assert_array_equal(np.asarray(got), np.asarray(expected), err_msg=key)


if __name__ == "__main__":
    absltest.main()
