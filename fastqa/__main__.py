"""``python -m fastqa ...`` is the ``fastqa`` command."""
import sys

from .cli import main

sys.exit(main())
