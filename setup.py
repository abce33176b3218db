"""Packaging for tfdist.

Tested range: TensorFlow 2.21 with Keras 3.15 and tf-keras 2.21 (the range
below is what the private TensorFlow and Keras names used under
tfdist/_internal/ are written against; ARCHITECTURE.md lists them).
"""

import setuptools

setuptools.setup(
    name="tfdist",
    version="0.1.0",
    description=(
        "Custom tf.distribute strategies behind the standard Keras model.fit"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["tfdist", "tfdist.*"]),
    package_data={"tfdist": ["py.typed"]},
    install_requires=[
        "tensorflow>=2.16,<2.22",
        "keras>=3.3,<3.16",
        "numpy>=1.26",
        "absl-py>=1.0",
        "portpicker>=1.6",  # tfdist.launch.local_cluster picks local ports.
    ],
    entry_points={"console_scripts": ["tfdist-launch=tfdist.launch:run_cli"]},
    extras_require={
        "legacy": ["tf-keras>=2.16,<2.22"],
        "examples": ["scikit-learn>=1.3"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.2",
            "pytest-xdist>=3.5",  # make test: two test processes (CONTRIBUTING.md).
            "portpicker>=1.6",
            "hypothesis>=6.100",
            "pyyaml>=6",
            "mypy>=1.10",
            "tensorboard>=2.16,<2.22",  # Tutorials' TensorBoard callback (tests/conformance).
        ],
        "bench": ["matplotlib>=3.7"],
        # make docs: Sphinx (autodoc, napoleon) and MyST for the Markdown pages;
        # tested with Sphinx 9.0 and myst-parser 5.2 (both need Python >= 3.11).
        "docs": ["sphinx>=9.0,<10", "myst-parser>=5.0,<6"],
    },
)
