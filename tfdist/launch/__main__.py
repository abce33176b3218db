"""`python -m tfdist.launch`: the `tfdist-launch` command line."""

from __future__ import annotations

import sys

from tfdist.launch import cli

if __name__ == "__main__":
    sys.exit(cli.run_cli())
