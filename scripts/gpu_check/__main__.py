"""``python scripts/gpu_check [ARGS]``: the GPU check (``make gpu-check`` runs it through scripts/gpu_check.sh);
with ``--child KEY``, one phase in a child of the supervisor. ``python -m gpu_check`` with scripts/ on the path
works too."""
from __future__ import annotations

import sys
from pathlib import Path

if not __package__:
    # Run as a folder: Python put this folder first on sys.path, where its modules (report, child, ...) would
    # shadow top-level names; its parent instead makes the package importable by its name.
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        sys.path[0] = str(here.parent)
    else:
        sys.path.insert(0, str(here.parent))

from gpu_check import main

sys.exit(main())
