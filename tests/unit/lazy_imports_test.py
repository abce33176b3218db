"""`import tfdist` is lazy: what needs no TensorFlow imports none.

Each check that looks at `sys.modules` runs in a fresh interpreter: this
test process has long imported TensorFlow (tests/conftest.py).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from absl.testing import parameterized

import tfdist
import tfdist.testing

# Top-level modules that count as "TensorFlow" here.
_TENSORFLOW_MODULES = ("keras", "tensorflow", "tf_keras")
# Far above the ~0.1 s these interpreters need: catches a hang only.
_BOUND_S = 60.0
# Prints, as JSON, the imported modules whose top level is in {roots}.
_PRINT_MODULES = (
    "import json, sys\n"
    "print(json.dumps(sorted(m for m in sys.modules\n"
    "                        if m.split('.')[0] in {roots!r})))\n"
)


def _python(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter that imports this checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(tfdist.__file__)))
    return subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=root),
        capture_output=True,
        text=True,
        timeout=_BOUND_S,
        check=False,
    )


def _modules_after(code: str, *roots: str) -> list[str]:
    """The modules under `roots` imported once `code` has run."""
    result = _python(code + "\n" + _PRINT_MODULES.format(roots=roots))
    if result.returncode:
        raise AssertionError(f"{code!r} failed:\n{result.stderr}")
    return json.loads(result.stdout.splitlines()[-1])


class NoTensorflowTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("tfdist", "import tfdist"),
        ("cluster_and_errors", "import tfdist.cluster, tfdist.errors"),
        (
            "cluster_api",
            "from tfdist.cluster import ClusterSpec, parse_tf_config",
        ),
        ("launch", "import tfdist.launch"),
        ("placement", "from tfdist.placement import plan_stages, PlacementReport"),
    )
    def test_import_loads_no_tensorflow(self, code):
        self.assertEqual(_modules_after(code, *_TENSORFLOW_MODULES), [])

    def test_launch_help_loads_no_tensorflow_and_prints_only_help(self):
        code = (
            "import contextlib, io, runpy, sys\n"
            "sys.argv = ['tfdist-launch', '--help']\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n"
            "        runpy.run_module('tfdist.launch', run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        assert e.code == 0, e.code\n"
            "assert out.getvalue().startswith('usage: tfdist-launch'), out\n"
        )

        self.assertEqual(_modules_after(code, *_TENSORFLOW_MODULES), [])

    def test_launch_help_writes_nothing_to_stderr(self):
        result = _python(
            "import runpy, sys\n"
            "sys.argv = ['tfdist-launch', '--help']\n"
            "runpy.run_module('tfdist.launch', run_name='__main__')\n"
        )

        self.assertEqual(result.returncode, 0)
        self.assertIn("usage: tfdist-launch", result.stdout)
        self.assertEqual(result.stderr, "")  # No TensorFlow start-up log.

    def test_testing_is_imported_only_when_asked_for(self):
        modules = _modules_after(
            "import tfdist; tfdist.MirroredStrategy; tfdist.cluster", "tfdist"
        )

        self.assertIn("tfdist.mirrored.strategy", modules)
        self.assertNotIn("tfdist.testing", modules)


class PublicNamesTest(parameterized.TestCase):
    def test_every_public_name_resolves(self):
        for name in tfdist.__all__:
            with self.subTest(name=name):
                self.assertIsNotNone(getattr(tfdist, name))

    def test_names_are_the_strategy_families_objects(self):
        from tfdist import mirrored  # noqa: PLC0415 - the point of the test.
        from tfdist import multi_worker  # noqa: PLC0415
        from tfdist.parameter_server import strategy as parameter_server  # noqa: PLC0415
        from tfdist.placement import strategy as placement  # noqa: PLC0415

        self.assertIs(tfdist.MirroredStrategy, mirrored.MirroredStrategy)
        self.assertIs(tfdist.LayerPlacementStrategy, placement.LayerPlacementStrategy)
        self.assertIs(tfdist.MultiWorkerMirroredStrategy, multi_worker.MultiWorkerMirroredStrategy)
        self.assertIs(tfdist.ParameterServerStrategy, parameter_server.ParameterServerStrategy)

    def test_cluster_resolver_name_resolves(self):
        from tfdist.cluster import resolver  # noqa: PLC0415

        self.assertIs(
            tfdist.cluster.to_cluster_resolver, resolver.to_cluster_resolver
        )

    def test_all_lazy_table_and_type_checking_imports_name_the_same_objects(self):
        # A public name is written in three places of tfdist/__init__.py; one
        # missed (or pointing at another module) fails here, not in a user's IDE.
        tree = ast.parse(open(tfdist.__file__, encoding="utf-8").read())
        type_checking = next(
            node for node in tree.body
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        )
        imported = {}
        for node in type_checking.body:
            for alias in node.names:
                imported[alias.asname or alias.name] = node.module
        lazy = {name: "tfdist" for name in tfdist._SUBPACKAGES}
        lazy.update(tfdist._ATTRIBUTE_MODULES)

        self.assertCountEqual(tfdist.__all__, lazy)
        self.assertEqual(imported, {
            name: module if name not in tfdist._SUBPACKAGES else "tfdist"
            for name, module in lazy.items()
        })

    def test_dir_lists_every_public_name(self):
        self.assertContainsSubset(tfdist.__all__, dir(tfdist))

    @parameterized.named_parameters(
        ("tfdist", tfdist), ("cluster", tfdist.cluster)
    )
    def test_unknown_name_raises_attribute_error(self, module):
        with self.assertRaisesRegex(AttributeError, r"no attribute 'nothing'"):
            module.nothing  # noqa: B018


if __name__ == "__main__":
    tfdist.testing.main()
