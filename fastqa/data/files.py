"""A user's files: reading them (every way it can fail becomes a ``UserError`` naming the file) and
writing them atomically (a temporary file in the same folder, flushed, then renamed over the target: a
crash leaves the old file or the new one, never half of one)."""
from __future__ import annotations

import contextlib
import errno
import gzip
import json
import os
import shutil
import signal
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from ..errors import UserError

__all__ = ["user_cache_dir", "read_text", "read_bytes", "decode_lines", "read_json", "atomic_open", "atomic_write_text",
           "atomic_write_json", "fault_point", "FAULT_POINT_VARIABLE", "no_room_error"]

FAULT_POINT_VARIABLE = "FASTQA_FAULT_POINT"
_fault_counts: dict[str, int] = {}


def fault_point(name: str) -> None:
    """A named place where the fault tests kill this process: with ``FASTQA_FAULT_POINT=NAME@N`` in the
    environment the N-th arrival here (``NAME`` alone: the first) sends SIGKILL to the process itself, as a
    power cut or the out-of-memory killer would; otherwise it does nothing. The names are documented in
    docs/models.md (Training runs)."""
    spec = os.environ.get(FAULT_POINT_VARIABLE)
    if not spec:
        return
    target, _, nth = spec.partition("@")
    if target != name:
        return
    _fault_counts[name] = _fault_counts.get(name, 0) + 1
    if _fault_counts[name] == (int(nth) if nth.isdigit() else 1):
        os.kill(os.getpid(), signal.SIGKILL)


def read_text(path: str | os.PathLike, what: str = "") -> str:
    """The UTF-8 text of ``path``, gzip-compressed or not (told by its first bytes; a BOM is dropped).

    ``what`` (e.g. "--context-file") is added to the messages. A missing file, a folder, an unreadable file,
    damaged or truncated gzip data, or bytes that are not UTF-8 (with the line) raise a UserError that names
    the file.
    """
    raw = read_bytes(path, what)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        note = f" ({what})" if what else ""
        raise UserError(f"{os.fspath(path)}: line {line}: not UTF-8 text ({e.reason}){note}") from None


def decode_lines(raw: bytes, source: str, *, skip_bad: bool = False, first: int = 1) -> tuple[list[str], list[int]]:
    """The lines of ``raw`` (split on \n; a \r before it and a first line's BOM dropped; a last line without
    a newline counts), each decoded as UTF-8 on its own, and the numbers of the lines that were not UTF-8
    (``raw``'s first line is line ``first``). Such a line is a UserError naming ``source`` and the line, or with
    ``skip_bad`` an empty line (so that outputs stay one per input line)."""
    parts = raw.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    lines, bad = [], []
    for number, part in enumerate(parts, first):
        try:
            line = part.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            if not skip_bad:
                raise UserError(f"{source}: line {number}: not UTF-8 text ({e.reason}); --skip-bad-lines "
                                "answers the other lines") from None
            bad.append(number)
            line = ""
        lines.append(line[:-1] if line.endswith("\r") else line)
    return lines, bad


def read_bytes(path: str | os.PathLike, what: str = "") -> bytes:
    """The bytes of ``path``, gunzipped when they are gzip data (told by the first bytes). A missing file, a
    folder, an unreadable file, or damaged or truncated gzip data raise a UserError naming the file (and
    ``what``, e.g. "--input")."""
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
        # A truncated stream raises EOFError, a bad header or CRC gzip.BadGzipFile (an OSError), corrupt
        # deflate data zlib.error -- which is neither of the other two.
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise UserError(f"{path}: cannot read (damaged gzip data: {e}){note}") from None
    return raw


def read_json(path: str | os.PathLike, what: str = "") -> Any:
    """The parsed JSON of ``path`` (read as ``read_text`` does, so ``.gz`` works too).

    Malformed JSON is a UserError with the line and column; JSON nested too deeply for Python's parser
    (a RecursionError, e.g. ``[[[[...`` a hundred thousand deep) is a UserError naming the file as well.
    """
    path = os.fspath(path)
    note = f" ({what})" if what else ""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}{note}") from None
    except RecursionError:
        raise UserError(f"{path}: the JSON is nested too deeply to read{note}") from None


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fault_point(f"{path.name}:before")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        fault_point(f"{path.name}:created")
        f = os.fdopen(fd, mode, **kwargs)
        try:
            yield f
            f.flush()
            fault_point(f"{path.name}:written")
            os.fsync(f.fileno())
        except BaseException:
            # Closing flushes what is still buffered, which fails the same way (a full disk) and would replace
            # the error being raised: close without letting that second error through.
            with contextlib.suppress(OSError):
                f.close()
            raise
        f.close()
        # mkstemp creates 0600; give the file the mode an ordinary open() would (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        fault_point(f"{path.name}:synced")
        os.replace(tmp, path)
        fault_point(f"{path.name}:renamed")
        _sync_folder(path.parent)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in _NO_ROOM:
            # Still an OSError (callers that treat a write as optional catch that), saying where and how much.
            raise OSError(e.errno, f"{e.strerror} ({_room(path, e)}; {_kept(path)})", os.fspath(path)) from None
        raise


_NO_ROOM = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _size(n: int) -> str:
    """``n`` bytes for a message: "512 bytes", "20.5 kB", "3.0 MB", "1.2 GB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _room(path: Path, error: OSError, needed: int | None = None) -> str:
    """What a write that found no room needed, the free space there, and the file-size limit if it was that."""
    try:
        free = f"{_size(shutil.disk_usage(path.parent).free)} free there"
    except OSError:
        free = "free space unknown"
    why = (f"it needs {_size(needed)}, " if needed is not None else "") + free
    if error.errno == errno.EFBIG:
        import resource  # Unix only, and only needed here

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            why += f", and this process may write files of at most {_size(limit)} (ulimit -f)"
    return why


def _kept(path: Path) -> str:
    """What a failed atomic write of ``path`` leaves."""
    return "the previous one is unchanged" if path.is_file() else "nothing was written"


def no_room_error(path: str | os.PathLike, error: OSError, *, needed: int | None = None, what: str = "",
                  kept: str | None = None) -> UserError | None:
    """The one-line ``UserError`` for a write to ``path`` that found no room -- a full disk, a quota, or the
    process's file-size limit (``ulimit -f``) -- naming the file, what it needed when known, the free space
    there (and the limit), and what is left on disk (``kept``; by default what an atomic write leaves); None
    for any other ``error``. ``what``: e.g. "the checkpoint". (``atomic_open`` itself raises such a failure as
    an ``OSError`` with the same details, for the callers to whom a write is optional.)"""
    if error.errno not in _NO_ROOM:
        return None
    path = Path(path)
    return UserError(f"{path}: cannot write {what or 'the file'} ({error.strerror or error}): "
                     f"{_room(path, error, needed)}; {kept or _kept(path)}")


def _sync_folder(folder: Path) -> None:
    """Flush ``folder``'s entries to disk, so that a rename survives a power cut as well as a crash (where
    the file system supports it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems (and Windows) cannot fsync a folder: the rename is then as durable as they are
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2,
                      default: Callable[[Any], Any] | None = None) -> None:
    """``obj`` as JSON (UTF-8, one final newline) into ``path``, atomically; ``default`` as ``json.dumps``'s (what
    a value JSON has no type for becomes, e.g. ``str``)."""
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, default=default) + "\n")


def user_cache_dir() -> Path:
    """Where fastqa keeps what it can recompute (preprocessed data, the machine's GEMM decisions):
    ``$FASTQA_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastqa``, else ``~/.cache/fastqa``."""
    if os.environ.get("FASTQA_CACHE_DIR"):
        return Path(os.environ["FASTQA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastqa"
