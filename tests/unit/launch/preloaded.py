"""A module the preload tests import in a template process.

Each import appends this process's pid to the file $TFDIST_TEST_IMPORTS
(so a test counts the imports), and `MARK` is $TFDIST_TEST_MARK as it was
at import (so a test sees which environment the import ran under).
"""

from __future__ import annotations

import os

MARK = os.environ.get("TFDIST_TEST_MARK")

with open(os.environ["TFDIST_TEST_IMPORTS"], "a") as _record:
    _record.write(f"{os.getpid()}\n")
