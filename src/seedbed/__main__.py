"""``python -m seedbed`` is the same as the ``seedbed`` command."""

from __future__ import annotations

import sys

from seedbed.cli import main

if __name__ == "__main__":
    sys.exit(main())
