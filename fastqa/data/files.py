"""Reading a user's file: one place that turns every way it can fail into a ``UserError`` naming it."""
from __future__ import annotations

import gzip
import os

from ..errors import UserError

__all__ = ["read_text"]


def read_text(path: str | os.PathLike, what: str = "") -> str:
    """The UTF-8 text of ``path``, gzip-compressed or not (told by its first bytes; a BOM is dropped).

    ``what`` (e.g. "--context-file") is added to the messages. A missing file, a folder, an unreadable or
    damaged file, or bytes that are not UTF-8 (with the line) raise a UserError that names the file.
    """
    path = os.fspath(path)
    note = f" ({what})" if what else ""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file{note}") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a file{note}") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e}){note}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:  # a truncated or corrupt .gz
            raise UserError(f"{path}: cannot read (damaged gzip data: {e}){note}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise UserError(f"{path}: line {line}: not UTF-8 text ({e.reason}){note}") from None
