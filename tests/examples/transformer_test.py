"""Smoke-runs examples/transformer.py as a user would, with --steps=2."""

from __future__ import annotations

import os
import sys

from absl.testing import absltest
import pytest

import tfdist
from tests import forked_script

pytestmark = pytest.mark.multiprocess

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SCRIPT = os.path.join(_ROOT, "examples", "transformer.py")
_TIMEOUT_S = 240


def _run(args):
    """`python -u transformer.py --epochs=1 --steps=2 ARGS` under Keras 3, forked from a template."""
    command = [sys.executable, "-u", _SCRIPT, "--epochs=1", "--steps=2", "--num_examples=256", *args]
    # This checkout's tfdist, not whichever one is installed.
    env = dict(os.environ, TF_USE_LEGACY_KERAS="0", PYTHONPATH=os.pathsep.join(
        filter(None, [_ROOT, os.environ.get("PYTHONPATH")])))
    return forked_script.run(command, env, cwd=_ROOT, timeout_s=_TIMEOUT_S)


class TransformerExampleTest(absltest.TestCase):

    def test_mesh_splits_attention_by_heads_the_feed_forward_pair_and_the_tables(self):
        result = _run([])  # The default: a 1x4 mesh, automatic layouts.
        self.assertEqual(result.returncode, 0, msg=result.stderr[-3000:])
        self.assertRegex(result.stdout, r"test_accuracy=0\.\d{4} examples_per_second=")
        self.assertIn("Mesh batch=1 x model=4", result.stdout)
        for variable, axes, why in (
            ("query/kernel", r"\(None, 'model', None\)", "split by heads"),
            ("attention_output/kernel", r"\('model', None, None\)", "split by heads"),
            ("dense/kernel", r"\(None, 'model'\)", "column-parallel"),
            ("dense_1/kernel", r"\('model', None\)", "row-parallel"),
            ("token_and_position_embedding/embedding/embeddings", r"\('model', None\)", "embedding: split by rows"),
        ):
            with self.subTest(variable=variable):
                self.assertRegex(result.stdout, rf"[ /]{variable} \| [^|]+ \| {axes} \| \d+ \| [^|\n]*{why}")


if __name__ == "__main__":
    tfdist.testing.main()
