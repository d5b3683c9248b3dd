"""``python -m bench.faults``: see ``bench.faults.campaign``."""

from __future__ import annotations

import sys

from bench.faults.campaign import main

if __name__ == "__main__":
    sys.exit(main())
