"""The one exception type for a user's mistake (a missing file, malformed data, a wrong checkpoint).

The ``fastqa`` command prints its message on one line and exits with status 2; library callers get an
ordinary exception (a ``ValueError``, so existing ``except ValueError`` code keeps working).
"""
from __future__ import annotations

__all__ = ["UserError"]


class UserError(ValueError):
    """Something the user can fix; the message names the file, argument or position."""
