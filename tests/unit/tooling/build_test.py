"""Checks BUILD against the source tree and the layering of ARCHITECTURE.md.

BUILD is parsed with Python's `ast` (BUILD syntax is a Python subset) and
compared with the files on disk; imports are read with tools/build_gen.py's
scanner, which the generator-level tests below exercise on small fake trees.

Runs under pytest and under Bazel. Under Bazel it reads the tree from its
runfiles (`data = [":source_tree"]`, with `legacy_create_init = False` so no
`__init__.py` files are invented), so it re-runs whenever a source changes.
"""

# bazel: size=small data=source_tree

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from absl.testing import absltest
from absl.testing import parameterized

import tfdist


def _repo_root() -> Path:
    """The source tree: Bazel's runfiles copy of it, else this checkout."""
    srcdir = os.environ.get("TEST_SRCDIR")
    workspace = os.environ.get("TEST_WORKSPACE")
    if srcdir and workspace:
        return Path(srcdir) / workspace
    return Path(__file__).resolve().parents[3]


def _load_build_gen(root: Path):
    """Imports tools/build_gen.py by path (tests never touch sys.path)."""
    name = "tfdist_tools_build_gen"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, root / "tools" / "build_gen.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ROOT = _repo_root()
build_gen = _load_build_gen(ROOT)


# --------------------------------------------------------------------------
# The layering rules of ARCHITECTURE.md, as data. Amend both when the design does.

#: Layer of each group; a module may import modules of its own group or of a
#: strictly lower layer. A group is a subpackage (`cluster`), a top-level
#: module (`devices` for tfdist/devices.py) or `__init__` (tfdist/__init__.py).
LAYERS: dict[str, int] = {
    "errors": 0,
    "_internal": 1,  # "may be imported by any tfdist module".
    "_validation": 1,  # Argument checks every layer's constructors use (no TensorFlow).
    "cluster": 2,
    "launch": 2,  # The local launcher: runs clusters, sits with cluster.
    "collectives": 3,
    "data": 3,  # The public sharders, and data/distributed (the strategies' input path): + cluster.
    "watchdog": 3,  # Bounded waits of multi-task jobs: cluster + _internal.
    "layers": 3,  # Keras layers for ps tables: errors + TF/Keras.
    # The strategy families: each package holds its strategy and what only it uses.
    "parameter_server": 4,  # Its strategy and machinery: cluster, launch, watchdog, _internal.
    "mirrored": 5,
    "multi_worker": 5,
    "placement": 5,  # Its strategy; its planner (plan, report) imports no TensorFlow.
    "mesh": 5,  # Its strategy; its mesh and layout checks (layouts) import no TensorFlow.
    "elastic": 6,  # Preemption and resumption of fit under any strategy: data, multi_worker.
    "testing": 6,  # "may import any public API".
    "__init__": 7,
}

#: Layer of a top-level module tfdist/<m>.py not named in LAYERS (devices.py:
#: imports TensorFlow, used by strategies and testing).
TOP_LEVEL_MODULE_LAYER = 3

#: (importer group, imported group) pairs allowed within one layer.
#: tfdist/launch/ imports only errors, _internal and cluster.
SAME_LAYER_IMPORTS = frozenset({("launch", "cluster")})

#: Files (or directories, ending in "/") that must import without TensorFlow,
#: directly or through the tfdist modules they import.
NO_TENSORFLOW = (
    "tfdist/cluster/spec.py",
    "tfdist/cluster/tf_config.py",
    "tfdist/placement/__init__.py",  # `import tfdist.placement` loads no TensorFlow.
    "tfdist/placement/plan.py",
    "tfdist/placement/report.py",
    "tfdist/mesh/__init__.py",  # `import tfdist.mesh` loads no TensorFlow: layouts are checked first.
    "tfdist/mesh/layouts.py",
    "tfdist/errors.py",  # ARCHITECTURE.md: the errors layer imports no TensorFlow.
    "tfdist/_validation.py",
    "tfdist/layers/hash_ring.py",  # Pure NumPy.
    "tfdist/launch/",  # `tfdist-launch --help` must not wait for TensorFlow.
)

#: Third-party modules that count as "TensorFlow" for NO_TENSORFLOW.
TENSORFLOW_MODULES = ("keras", "tensorflow", "tf_keras")

#: Private modules of TensorFlow/Keras, and the only files (or directories,
#: ending in "/") of tfdist/ and examples/ that may import them (ARCHITECTURE.md).
PRIVATE_UPSTREAM = {
    "tensorflow.python": ("tfdist/_internal/",),
    "tensorflow.core": ("tfdist/_internal/",),
    "tensorflow.compiler": ("tfdist/_internal/",),
    "keras.src": ("tfdist/_internal/",),
    "tf_keras.src": ("tfdist/_internal/",),
}


def group_of(module: str) -> str:
    """'tfdist.cluster.spec' -> 'cluster'; 'tfdist' -> '__init__'."""
    parts = module.split(".")
    assert parts[0] == "tfdist", module
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(path: str, module: str) -> int | None:
    """The layer of a tfdist module, or None if LAYERS does not place it."""
    group = group_of(module)
    if group in LAYERS:
        return LAYERS[group]
    if path.count("/") == 1:  # tfdist/<m>.py
        return TOP_LEVEL_MODULE_LAYER
    return None


def _matches(path: str, patterns: Iterable[str]) -> bool:
    return any(
        path == p or (p.endswith("/") and path.startswith(p)) for p in patterns
    )


# --------------------------------------------------------------------------
# Reading BUILD.


@dataclasses.dataclass(frozen=True)
class Glob:
    """A `glob([...])` call in BUILD, unexpanded."""

    patterns: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Rule:
    kind: str
    attrs: Mapping[str, object]

    @property
    def name(self) -> str:
        return str(self.attrs.get("name", ""))

    def strings(self, attr: str) -> list[str]:
        return [v for v in self.attrs.get(attr, []) if isinstance(v, str)]


def _evaluate(node: ast.expr) -> object:
    """Evaluates what BUILD uses: literals, lists, `+` and glob()."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List):
        return [_evaluate(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _evaluate(node.left) + _evaluate(node.right)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "glob"
    ):
        (patterns,) = node.args
        return [Glob(tuple(_evaluate(patterns)))]
    raise ValueError(
        f"BUILD line {node.lineno}: unsupported expression {ast.dump(node)}"
    )


def parse_build(text: str) -> list[Rule]:
    """The rule calls of a BUILD file, in order."""
    rules = []
    for statement in ast.parse(text, filename="BUILD").body:
        if not (
            isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Name)
            and not statement.value.args
        ):
            raise ValueError(
                f"BUILD line {statement.lineno}: expected a rule call with "
                "keyword arguments"
            )
        call = statement.value
        rules.append(
            Rule(
                call.func.id, {k.arg: _evaluate(k.value) for k in call.keywords}
            )
        )
    return rules


def _find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle in `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done.
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for succ in sorted(graph.get(node, ())):
            if state.get(succ) == 1:
                return stack[stack.index(succ) :] + [succ]
            if succ not in state:
                found = visit(succ)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


# --------------------------------------------------------------------------
# BUILD against the tree.


class BuildFileTest(absltest.TestCase):
    """The checked-in BUILD describes the tree as it is."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sources = build_gen.read_tree(ROOT)
        cls.rules = parse_build((ROOT / "BUILD").read_text(encoding="utf-8"))
        cls.python_rules = [
            r
            for r in cls.rules
            if r.kind in ("py_library", "py_test", "py_binary")
        ]
        cls.path_of_module = {s.module: p for p, s in cls.sources.items()}
        cls.owner = {}
        for rule in cls.python_rules:
            for src in rule.strings("srcs"):
                cls.owner.setdefault(src, []).append(rule.name)

    def test_build_matches_generator_output_when_checked(self):
        out = io.StringIO()
        self.assertTrue(build_gen.check(ROOT, out=out), out.getvalue())

    def test_rule_names_are_unique_across_build(self):
        names = [r.name for r in self.rules if r.name]
        self.assertEqual(sorted(set(names)), sorted(names))

    def test_every_tfdist_module_is_in_exactly_one_library(self):
        for path in self.sources:
            if not path.startswith("tfdist/"):
                continue
            with self.subTest(path=path):
                owners = self.owner.get(path, [])
                self.assertLen(
                    owners,
                    1,
                    f"{path} is in the srcs of {owners or 'no target'}",
                )
                kind = {r.name: r.kind for r in self.python_rules}[owners[0]]
                self.assertEqual(kind, "py_library", path)

    def test_every_build_src_exists_in_tree(self):
        for path in self.owner:
            self.assertIn(
                path, self.sources, f"BUILD lists {path}, which does not exist"
            )

    def test_every_test_file_has_a_py_test_with_itself_as_main(self):
        tests = {
            r.strings("srcs")[0]: r
            for r in self.python_rules
            if r.kind == "py_test"
        }
        test_files = [p for p in self.sources if build_gen.is_test_file(p)]
        self.assertIn("tests/unit/tooling/build_test.py", test_files)
        for path in test_files:
            with self.subTest(path=path):
                self.assertIn(path, tests, f"{path} has no py_test")
                self.assertEqual(tests[path].strings("srcs"), [path])
                self.assertEqual(tests[path].attrs.get("main"), path)

    def test_test_file_basenames_are_unique_for_pytest(self):
        # pytest's default import mode imports each test file by basename;
        # two tests/**/x_test.py files collide at collection time.
        basenames = {}
        for path in self.sources:
            if build_gen.is_test_file(path):
                basenames.setdefault(path.rsplit("/", 1)[-1], []).append(path)
        duplicates = {k: v for k, v in basenames.items() if len(v) > 1}
        self.assertEqual(duplicates, {}, "rename one of each pair")

    def test_every_example_has_a_py_binary(self):
        binaries = {
            r.attrs.get("main")
            for r in self.python_rules
            if r.kind == "py_binary"
        }
        for path in self.sources:
            if path.startswith("examples/"):
                self.assertIn(path, binaries)

    def test_test_sizes_and_tags_are_from_allowed_sets(self):
        for rule in self.python_rules:
            if rule.kind != "py_test":
                continue
            with self.subTest(rule=rule.name):
                self.assertIn(rule.attrs.get("size"), build_gen.SIZES)
                self.assertContainsSubset(
                    rule.strings("tags"), set(build_gen.ALLOWED_TAGS)
                )

    def test_deps_cover_first_party_imports_for_every_target(self):
        for rule in self.python_rules:
            deps = set(rule.strings("deps"))
            for src in rule.strings("srcs"):
                for module in self.sources[src].imports:
                    path = self.path_of_module[module]
                    (owner,) = self.owner.get(path, [None])
                    if owner != rule.name:
                        with self.subTest(src=src, module=module):
                            self.assertIn(
                                f":{owner}",
                                deps,
                                f"{rule.name} ({src}) imports {module}, "
                                f"owned by :{owner}",
                            )

    def test_deps_name_existing_python_targets(self):
        names = {r.name for r in self.python_rules}
        for rule in self.python_rules:
            for dep in rule.strings("deps"):
                self.assertIn(
                    dep.lstrip(":"),
                    names,
                    f"{rule.name} depends on unknown {dep}",
                )

    def test_deps_have_no_cycles(self):
        graph = {
            r.name: [d.lstrip(":") for d in r.strings("deps")]
            for r in self.python_rules
        }
        self.assertIsNone(_find_cycle(graph))

    def test_every_test_file_runs_its_tests_when_executed_directly(self):
        # Bazel runs `python file.py`: without the guard, a test file
        # passes having run nothing.
        for path in self.sources:
            if not build_gen.is_test_file(path):
                continue
            with self.subTest(path=path):
                tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
                guards = [
                    node
                    for node in tree.body
                    if isinstance(node, ast.If)
                    and isinstance(node.test, ast.Compare)
                    and ast.unparse(node.test).replace("'", '"')
                    == '__name__ == "__main__"'
                ]
                self.assertLen(
                    guards,
                    1,
                    f"{path} lacks `if __name__ == "
                    '"__main__": tfdist.testing.main()`',
                )
                calls = [
                    ast.unparse(n.func)
                    for n in ast.walk(guards[0])
                    if isinstance(n, ast.Call)
                ]
                self.assertTrue(
                    any(c == "main" or c.endswith(".main") for c in calls),
                    f"{path}: the __main__ block calls {calls}, not "
                    "tfdist.testing.main()",
                )


# --------------------------------------------------------------------------
# Layering (ARCHITECTURE.md).


class LayeringTest(absltest.TestCase):
    """Dependencies between tfdist modules point one way."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sources = build_gen.read_tree(ROOT)
        cls.by_module = {s.module: s for s in cls.sources.values()}

    def _tfdist_sources(self):
        return [
            s
            for p, s in sorted(self.sources.items())
            if p.startswith("tfdist/")
        ]

    def test_every_tfdist_module_has_a_layer(self):
        for source in self._tfdist_sources():
            self.assertIsNotNone(
                layer_of(source.path, source.module),
                f"{source.path}: subpackage {group_of(source.module)!r} "
                "has no layer; add it to LAYERS",
            )

    def test_tfdist_modules_import_only_lower_layers_or_own_group(self):
        for source in self._tfdist_sources():
            group = group_of(source.module)
            layer = layer_of(source.path, source.module)
            for module in source.imports:
                imported = self.by_module[module]
                imported_group = group_of(module)
                if imported_group == group:
                    continue
                imported_layer = layer_of(imported.path, module)
                with self.subTest(importer=source.path, imported=module):
                    self.assertTrue(
                        imported_layer is not None
                        and layer is not None
                        and (
                            imported_layer < layer
                            or (
                                imported_layer == layer
                                and (group, imported_group)
                                in SAME_LAYER_IMPORTS
                            )
                        ),
                        f"{source.path} ({group}, layer {layer}) imports "
                        f"{module} ({imported_group}, layer {imported_layer})"
                        "; ARCHITECTURE.md allows only lower layers",
                    )

    def test_pure_python_modules_import_no_tensorflow_even_transitively(self):
        for source in self._tfdist_sources():
            if not _matches(source.path, NO_TENSORFLOW):
                continue
            with self.subTest(path=source.path):
                chain = self._tensorflow_chain(source.module)
                self.assertIsNone(
                    chain, f"{source.path} imports TensorFlow via {chain}"
                )

    def _tensorflow_chain(self, module: str) -> list[str] | None:
        """[module, ..., tf-module] if `module` reaches TensorFlow, else None.

        Follows the tfdist modules a file imports, not the parent packages
        Python also runs (tfdist/__init__.py imports everything by design).
        """
        seen = set()
        frontier = [[module]]
        while frontier:
            chain = frontier.pop()
            source = self.by_module[chain[-1]]
            for package in source.third_party:
                if package in TENSORFLOW_MODULES:
                    return chain + [package]
            for imported in source.imports:
                if imported not in seen and imported.startswith("tfdist"):
                    seen.add(imported)
                    frontier.append(chain + [imported])
        return None

    def test_private_modules_are_imported_only_by_own_subpackage_and_tests(
        self,
    ):
        for path, source in sorted(self.sources.items()):
            if path.startswith("tests/"):
                continue
            for module in source.imports:
                parts = module.split(".")
                private = [
                    i
                    for i, p in enumerate(parts)
                    if p.startswith("_") and i >= 2
                ]
                if parts[0] != "tfdist" or not private:
                    continue
                owner_package = ".".join(parts[: private[0]])
                with self.subTest(importer=path, imported=module):
                    self.assertTrue(
                        source.module == owner_package
                        or source.module.startswith(owner_package + "."),
                        f"{path} imports private {module}; only "
                        f"{owner_package} and tests may",
                    )

    def test_examples_import_only_public_api(self):
        for path, source in sorted(self.sources.items()):
            if not path.startswith("examples/"):
                continue
            for module in source.imports:
                with self.subTest(example=path, imported=module):
                    self.assertFalse(
                        any(p.startswith("_") for p in module.split(".")),
                        f"{path} imports {module}: examples use only the "
                        "public API",
                    )

    def test_upstream_internals_are_imported_only_by_allowed_files(self):
        for path in sorted(self.sources):
            if not path.startswith(("tfdist/", "examples/")):
                continue
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                for name in names:
                    for prefix, allowed in PRIVATE_UPSTREAM.items():
                        if name == prefix or name.startswith(prefix + "."):
                            with self.subTest(path=path, imported=name):
                                self.assertTrue(
                                    _matches(path, allowed),
                                    f"{path}:{node.lineno} imports {name};"
                                    f" only {allowed} may",
                                )


def _foreign_dict(expr: ast.expr) -> bool:
    """`vars(x)` or `x.__dict__` for an `x` other than self/cls."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "vars":
        owner = expr.args[0] if expr.args else None
    elif isinstance(expr, ast.Attribute) and expr.attr == "__dict__":
        owner = expr.value
    else:
        return False
    return not (isinstance(owner, ast.Name) and owner.id in ("self", "cls"))


def _written(node: ast.AST) -> list[ast.expr]:
    """What `node` writes that swaps a class or changes another object's instance dict."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        return [
            t for t in targets
            if (isinstance(t, ast.Attribute) and t.attr in ("__class__", "__dict__"))
            or (isinstance(t, ast.Subscript) and _foreign_dict(t.value))
        ]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("update", "pop", "popitem", "setdefault", "clear", "__setitem__")
        and _foreign_dict(node.func.value)
    ):
        return [node.func]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "setattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in ("__class__", "__dict__")
    ):
        return [node.func]
    return []


class PrivateUpstreamAttributeTest(absltest.TestCase):
    """Outside tfdist/_internal/, no module touches TF's or Keras's private names.

    Imports are covered by LayeringTest; this covers attributes: reaching
    into another object (`obj._x`), reading an attribute a TF base class set
    (`self._devices`), and overriding a TF method that is private
    (`def _update`). tfdist's own private names are fine.
    """

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.trees = {
            path: ast.parse((ROOT / path).read_text(encoding="utf-8"))
            for path in sorted(build_gen.read_tree(ROOT))
            if path.startswith("tfdist/") and not path.startswith("tfdist/_internal/")
        }
        cls.own_names = set()  # Private names tfdist itself defines anywhere.
        for tree in cls.trees.values():
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    cls.own_names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    cls.own_names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    cls.own_names.add(node.id)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    cls.own_names.add(node.target.id)

    def test_architecture_lists_every_adapter_module(self):
        # ARCHITECTURE.md's private-API table is the index of what tfdist
        # reaches; an adapter missing from it is a reach nobody reviews.
        table = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
        for path in sorted(build_gen.read_tree(ROOT)):
            if path.startswith("tfdist/_internal/") and not path.endswith("__init__.py"):
                with self.subTest(path=path):
                    self.assertIn(f"| `{path.rsplit('/', 1)[1]}` |", table)

    def test_readme_layout_lists_every_package_and_top_level_module(self):
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        layout = readme.split("## Layout", 1)[1].split("```")[1]
        for entry in sorted((ROOT / "tfdist").iterdir()):
            if entry.name.startswith("__pycache__") or entry.name == "__init__.py":
                continue
            shown = f"  {entry.name}/" if entry.is_dir() else f"  {entry.name}"
            with self.subTest(entry=entry.name):
                self.assertIn(shown, layout)

    def test_no_reach_into_other_objects_private_attributes(self):
        for path, tree in self.trees.items():
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                    continue
                if _is_stdlib_public(node):
                    continue
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if (
                    isinstance(base, ast.Call)
                    and isinstance(base.func, ast.Name)
                    and base.func.id == "super"
                ):
                    continue
                with self.subTest(path=path, line=node.lineno):
                    self.fail(f"{path}:{node.lineno}: {ast.unparse(node)} reaches a private attribute")

    def test_no_class_swaps_or_writes_into_another_objects_dict(self):
        # Those go through tfdist/_internal/attributes.py (swap_class,
        # instance_attributes), where the boundary can see them.
        for path, tree in self.trees.items():
            for node in ast.walk(tree):
                for target in _written(node):
                    with self.subTest(path=path, line=node.lineno):
                        self.fail(
                            f"{path}:{node.lineno}: {ast.unparse(target)} changes another "
                            "object's class or instance dict; use tfdist/_internal/attributes"
                        )

    def test_private_attributes_of_self_are_tfdist_own(self):
        for path, tree in self.trees.items():
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and _is_private(node.attr)
                    and node.attr not in self.own_names
                    and not _is_stdlib_public(node)
                ):
                    with self.subTest(path=path, line=node.lineno):
                        self.fail(
                            f"{path}:{node.lineno}: {ast.unparse(node)} uses "
                            f"{node.attr}, which tfdist never defines: an "
                            "upstream private attribute; reach it in "
                            "tfdist/_internal/"
                        )

    def test_classes_override_no_private_upstream_methods(self):
        for path in self.trees:
            module_name = path[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            module = importlib.import_module(module_name)
            for cls in vars(module).values():
                if not (isinstance(cls, type) and cls.__module__ == module_name):
                    continue
                upstream = [
                    base for base in cls.__mro__[1:]
                    if base.__module__.split(".")[0] in TENSORFLOW_MODULES
                ]
                for name in vars(cls):
                    if not _is_private(name):
                        continue
                    owners = [b.__qualname__ for b in upstream if name in vars(b)]
                    with self.subTest(cls=cls.__qualname__, name=name):
                        self.assertEqual(
                            owners, [],
                            f"{module_name}.{cls.__qualname__} overrides {name} "
                            f"of {owners}; override it in tfdist/_internal/",
                        )


def _is_private(name: str) -> bool:
    """Single-underscore names, but not Python's own machinery (`_abc_impl`)."""
    return name.startswith("_") and not name.startswith("__") and name != "_abc_impl"


#: Documented public names of Python's standard library that begin with an underscore.
_STDLIB_PUBLIC = {("os", "_exit")}


def _is_stdlib_public(node: ast.Attribute) -> bool:
    """Whether `node` is one of `_STDLIB_PUBLIC` (`os._exit`)."""
    return isinstance(node.value, ast.Name) and (node.value.id, node.attr) in _STDLIB_PUBLIC


# --------------------------------------------------------------------------
# The generator itself, on small fake trees.


def _write_tree(root: Path, files: Mapping[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")


_FAKE_TREE = {
    "tfdist/__init__.py": (
        "from tfdist import cluster\nfrom tfdist.devices import f\n"
    ),
    "tfdist/errors.py": "",
    "tfdist/devices.py": "import tensorflow as tf\nfrom tfdist import errors\n",
    "tfdist/cluster/__init__.py": "from . import spec\nfrom .spec import X\n",
    "tfdist/cluster/spec.py": (
        "import json\nfrom .. import errors\nimport numpy as np\n"
    ),
    "tfdist/cluster/_format.py": "from tfdist.cluster.spec import Spec\n",
    "tfdist/_internal/__init__.py": "",
    "tfdist/testing/__init__.py": (
        "def main():\n    from absl.testing import absltest\n"
    ),
    "tests/conftest.py": "import tfdist.testing\n",
    "tests/unit/cluster/spec_test.py": (
        "import tfdist\nfrom tfdist.cluster import _format\n"
    ),
    "tests/integration/cluster_test.py": "import tfdist\n",
    "tests/numerics/helpers.py": "import tfdist.cluster\n",
    "tests/numerics/fit_test.py": (
        "# bazel: size=large tags=slow,manual\n"
        "from tests.numerics import helpers\n"
        'x = """\n# bazel: size=small\n"""\n'  # Not a comment: ignored.
    ),
    "tests/examples/demo_test.py": "import tfdist\n",
    "examples/demo.py": "import tfdist\nfrom absl import app\n",
}


class GeneratorTest(parameterized.TestCase):
    """tools/build_gen.py on fake trees."""

    def _tempdir(self) -> Path:
        # Not absltest's create_tempdir: it needs absl flags parsed, and
        # pytest does not parse them.
        path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, path)
        return Path(path)

    def _targets(self, files: Mapping[str, str]):
        root = self._tempdir()
        _write_tree(root, files)
        return {
            t.name: t
            for t in build_gen.build_targets(build_gen.read_tree(root))
        }

    def test_libraries_group_subpackages_and_split_top_level_modules(self):
        targets = self._targets(_FAKE_TREE)
        self.assertEqual(
            targets["cluster"].srcs,
            [
                "tfdist/cluster/__init__.py",
                "tfdist/cluster/_format.py",
                "tfdist/cluster/spec.py",
            ],
        )
        self.assertEqual(targets["tfdist"].srcs, ["tfdist/__init__.py"])
        self.assertEqual(targets["devices"].srcs, ["tfdist/devices.py"])
        self.assertEqual(
            targets["internal"].srcs, ["tfdist/_internal/__init__.py"]
        )

    def test_deps_follow_absolute_relative_and_from_imports_without_self_deps(
        self,
    ):
        targets = self._targets(_FAKE_TREE)
        self.assertEqual(targets["tfdist"].deps, [":cluster", ":devices"])
        self.assertEqual(targets["cluster"].deps, [":errors"])
        self.assertEqual(targets["devices"].deps, [":errors"])

    def test_third_party_imports_become_implicit_comments_without_stdlib(self):
        targets = self._targets(_FAKE_TREE)
        self.assertEqual(targets["cluster"].implicit, ["numpy"])
        self.assertEqual(targets["testing"].implicit, ["absl"])
        rendered = build_gen.render_target(targets["devices"])
        self.assertIn(
            'deps = [":errors"],  # Implicit tensorflow dependency.', rendered
        )

    def test_tests_get_size_and_tags_from_directory(self):
        targets = self._targets(_FAKE_TREE)
        self.assertEqual(targets["cluster_spec_test"].size, "small")
        self.assertEqual(
            targets["cluster_spec_test"].deps, [":cluster", ":tfdist"]
        )
        self.assertEqual(targets["integration_cluster_test"].size, "large")
        self.assertEqual(
            targets["integration_cluster_test"].tags, ("multiprocess", "slow")
        )

    def test_tests_get_size_and_tags_from_directive_when_given(self):
        targets = self._targets(_FAKE_TREE)
        self.assertEqual(targets["numerics_fit_test"].size, "large")
        self.assertEqual(targets["numerics_fit_test"].tags, ("manual", "slow"))
        self.assertEqual(
            targets["numerics_fit_test"].deps, [":numerics_testlib"]
        )
        self.assertEqual(targets["numerics_testlib"].deps, [":cluster"])
        self.assertTrue(targets["numerics_testlib"].testonly)

    def test_example_tests_get_examples_as_data(self):
        targets = self._targets(_FAKE_TREE)
        self.assertEqual(
            targets["examples_demo_test"].data, ["examples/demo.py"]
        )
        self.assertEqual(targets["demo"].kind, "py_binary")
        self.assertEqual(targets["demo"].main, "examples/demo.py")

    def test_conftest_gets_no_target(self):
        targets = self._targets(_FAKE_TREE)
        srcs = [s for t in targets.values() for s in t.srcs]
        self.assertNotIn("tests/conftest.py", srcs)

    def test_rendered_build_parses_and_is_stable(self):
        root = self._tempdir()
        _write_tree(root, _FAKE_TREE)
        text = build_gen.generate(root)
        self.assertEqual(text, build_gen.generate(root))
        rules = parse_build(text)
        self.assertIn("cluster_spec_test", [r.name for r in rules])
        self.assertTrue(text.startswith("# Generated by tools/build_gen.py"))

    @parameterized.named_parameters(
        ("bad_size", "# bazel: size=huge\n", "not a Bazel test size"),
        (
            "bad_tag",
            "# bazel: tags=flaky\n",
            "allowed: gpu, manual, multiprocess, slow",
        ),
        ("unknown_key", "# bazel: timeout=long\n", "unknown `# bazel:` key"),
        ("no_value", "# bazel: slow\n", "expects key=value"),
    )
    def test_generate_raises_readable_error_on_bad_directive(
        self, header, message
    ):
        root = self._tempdir()
        _write_tree(
            root, {"tfdist/__init__.py": "", "tests/unit/a_test.py": header}
        )
        with self.assertRaisesRegex(
            build_gen.BuildGenError,
            "tests/unit/a_test.py.*" + message.replace("(", r"\("),
        ):
            build_gen.generate(root)

    def test_generate_raises_on_import_of_missing_module(self):
        root = self._tempdir()
        _write_tree(root, {"tfdist/__init__.py": "from tfdist.nope import x\n"})
        with self.assertRaisesRegex(
            build_gen.BuildGenError,
            r"tfdist/__init__.py:1: imports tfdist.nope,",
        ):
            build_gen.generate(root)

    @parameterized.named_parameters(
        ("library_and_binary", "examples/errors.py"),
        ("module_and_private_module", "tfdist/_errors.py"),
        ("module_and_subpackage", "tfdist/errors/__init__.py"),
    )
    def test_generate_raises_when_two_files_claim_one_target_name(self, other):
        root = self._tempdir()
        _write_tree(root, {"tfdist/errors.py": "", other: ""})
        with self.assertRaisesRegex(
            build_gen.BuildGenError, "'errors' is claimed by several files"
        ):
            build_gen.generate(root)

    def test_check_exits_nonzero_with_diff_when_build_is_stale(self):
        root = self._tempdir()
        _write_tree(root, _FAKE_TREE)
        self.assertEqual(build_gen.main(["--root", str(root)]), 0)
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(
                build_gen.main(["--root", str(root), "--check"]), 0
            )
        _write_tree(root, {"tfdist/cluster/tf_config.py": ""})
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(
                build_gen.main(["--root", str(root), "--check"]), 1
            )
        self.assertIn('+        "tfdist/cluster/tf_config.py",', out.getvalue())
        self.assertIn("python tools/build_gen.py", out.getvalue())

    def test_find_cycle_reports_path_when_deps_loop(self):
        self.assertEqual(
            _find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}),
            ["a", "b", "c", "a"],
        )
        self.assertIsNone(_find_cycle({"a": ["b"], "b": []}))


if __name__ == "__main__":
    tfdist.testing.main()
