"""``python -m lra.measure.compare``: the same program as ``scripts/compare_pytorch.py``."""

import sys

from lra.measure.compare_cli import compare_main

sys.exit(compare_main())
