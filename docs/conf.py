"""Sphinx configuration: the Markdown pages of docs/ and the API reference.

Built offline by `make docs`:

    sphinx-build -W --keep-going -n -c docs -b html . docs/_build/html

Warnings are errors and every cross-reference must resolve. The source
directory is the repository root, restricted by `include_patterns` to docs/
and the Markdown files the pages link to (README.md, ARCHITECTURE.md,
CONTRIBUTING.md, benchmarks/RESULTS.md), so that a relative link such as
`../benchmarks/RESULTS.md#isolated-vs-host-network` is checked, anchor
included, and reads the same on GitHub. Nothing here downloads: no
intersphinx, so references to TensorFlow, Keras, NumPy and standard-library
types are listed in `nitpick_ignore` below.
"""

from __future__ import annotations

import functools
import importlib

project = "tfdist"
author = "tfdist authors"
release = importlib.import_module("tfdist").__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "docs/index"
include_patterns = [
    "docs/**",
    "README.md",
    "ARCHITECTURE.md",
    "CONTRIBUTING.md",
    "benchmarks/RESULTS.md",
]
exclude_patterns = ["docs/_build", ".venv", ".git", "bazel-*"]

# Google-style docstrings (CONTRIBUTING.md, "Style"); no NumPy style here.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}

# GitHub-style anchors (`page.md#section`) for headings down to level 4.
myst_heading_anchors = 4

html_theme = "alabaster"
html_static_path: list[str] = []
html_show_sourcelink = False

nitpicky = True

# References that cannot resolve offline (no intersphinx): TensorFlow, Keras
# and NumPy types, and standard-library types, as they appear in signatures
# and base-class lists. Nothing of tfdist's own belongs here.
nitpick_ignore = [
    ("py:class", "collections.abc.Callable"),
    ("py:class", "collections.abc.Iterator"),
    ("py:class", "collections.abc.Mapping"),
    ("py:class", "collections.abc.Sequence"),
    ("py:class", "enum.Enum"),
    ("py:class", "os.PathLike"),
]
nitpick_ignore_regex = [
    ("py:class", r"tensorflow\..*"),
    ("py:class", r"keras\..*"),
    ("py:class", r"numpy\..*"),
]

# The packages whose `__all__` is the public API (tfdist/__init__.py's
# `__all__` lists them).
PUBLIC_PACKAGES = (
    "tfdist",
    "tfdist.cluster",
    "tfdist.collectives",
    "tfdist.data",
    "tfdist.errors",
    "tfdist.launch",
    "tfdist.layers",
    "tfdist.placement",
    "tfdist.testing",
)


@functools.cache
def _public_objects() -> frozenset[int]:
    public: set[int] = set()
    for name in PUBLIC_PACKAGES:
        module = importlib.import_module(name)
        public.update(id(getattr(module, attr)) for attr in module.__all__)
    return frozenset(public)


def _drop_private_bases(app, name, obj, options, bases) -> None:
    """Lists only public base classes: tfdist's private mixins are not API."""
    bases[:] = [
        base
        for base in bases
        if not base.__module__.startswith("tfdist") or id(base) in _public_objects()
    ]


def setup(app) -> None:
    app.connect("autodoc-process-bases", _drop_private_bases)
