"""zerospec: the ZeRO paper, executable (report, plan, scale, train, paper, demo)."""
from __future__ import annotations

import sys

from .cli.main import build_parser, main  # noqa: F401  (the entry point and its parser)

if __name__ == "__main__":
    sys.exit(main())
