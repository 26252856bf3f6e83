"""Guarding a run folder while a trainer writes it.

* ``RunFolderLock``: an exclusive ``fcntl.flock`` on ``OUT/.lock`` for as long as the trainer runs; the
  file holds the holder's pid so a second trainer on the same folder fails at once with a message naming
  it. The kernel drops the lock when the holder's file is closed -- also when the process dies, however
  it dies -- so a crashed run never leaves the folder locked. The file itself stays (removing it while
  others may be opening it would let two trainers lock two different files of the same name).
* ``remove_stale_temporaries``: an interrupted atomic write (``fastqa.data.files.atomic_open``) can
  leave its temporary ``.NAME.<random>.tmp`` behind (a kill -9 or a power cut skips its clean-up). With
  the lock held nobody else is writing the folder, so any such file is garbage and is removed.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import time
from pathlib import Path

from ..errors import UserError

try:
    import fcntl
except ImportError:  # Windows: no flock; the folder is then not guarded
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "RunFolderLock", "remove_stale_temporaries"]

log = logging.getLogger("fastqa.train")

LOCK_NAME = ".lock"
# atomic_open's temporaries: a dot, the target's name, a dot, mkstemp's random letters, ".tmp".
_STALE_TMP = re.compile(r"^\..+\.[A-Za-z0-9_]+\.tmp$")


class RunFolderLock:
    """Context manager holding the exclusive lock of ``out_dir`` (created if missing); raises a one-line
    ``UserError`` naming the holder's pid when another process holds it."""

    def __init__(self, out_dir: str | os.PathLike) -> None:
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            return
        # No O_TRUNC: opening must not erase the pid of a holder we are about to be refused by.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{self.out_dir}: another trainer (pid {self._holder()}) is writing this folder; "
                                "wait for it to finish or choose another --out") from None
            # A file system without flock (some network mounts): train unguarded rather than not at all.
            log.warning("%s: cannot lock the run folder (%s); another trainer could write it at the same time",
                        self.path, e.strerror)
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def _holder(self) -> str:
        """The pid written by the holder; it may not be there yet if the holder has just locked, so wait a
        moment for it."""
        for _ in range(5):
            try:
                text = self.path.read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                text = ""
            if text:
                return text
            time.sleep(0.05)
        return "unknown"

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "RunFolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def remove_stale_temporaries(out_dir: str | os.PathLike) -> list[str]:
    """Delete the leftovers of interrupted atomic writes in ``out_dir`` (not its subfolders); returns their
    names. Call only while holding the folder's lock."""
    removed = []
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return removed
    for p in sorted(out_dir.iterdir()):
        if _STALE_TMP.match(p.name) and p.is_file():
            try:
                p.unlink()
            except FileNotFoundError:
                continue
            removed.append(p.name)
    if removed:
        log.warning("%s: removed %d temporary file(s) left by an interrupted write: %s", out_dir, len(removed),
                    ", ".join(removed))
    return removed
