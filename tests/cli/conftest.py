"""The CLI's tests share the lock-holder process helper of tests/edgemask (the one-writer rule is edgemask's)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "edgemask"))
