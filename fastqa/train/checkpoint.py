"""Atomic, self-describing, checksummed checkpoints.

A checkpoint is one ``torch.save`` file holding everything needed to resume exactly (weights, EMA,
optimizer, scheduler, step, position in the data order, RNG states) and to use the model without the
training data (its config and vocabularies, in ``meta``). Every write goes to a temporary file in the same
folder, is flushed to disk, then renamed over the target: a crash leaves the old file or the new one,
never half of one.

Checksum: ``torch.save`` writes a zip archive, and a zip archive may end with a comment that readers skip.
The comment of a fastqa checkpoint is ``fastqa-sha256:<hex digest>`` of every byte before the comment's
2-byte length field (the archive proper), so the file is still an ordinary ``torch.load``-able archive and
a damaged one -- a flipped bit on disk, a truncated copy -- is refused with a ``UserError`` naming it
instead of being loaded with wrong numbers. Checkpoints written before the checksum existed (no comment)
still load.

Failures while writing: a full disk or a file-size limit (``ulimit -f``) is a ``UserError`` naming the file,
what it needed and the free space (and the limit), and the previous checkpoint is left as it was. A process
killed at any point of the write (``fastqa.data.files.fault_point``: ``checkpoint.pt:before``, ``:created``,
``:half`` -- half of the archive on disk --, ``:written``, ``:synced``, ``:renamed``) leaves the previous
checkpoint or the new one, never a torn one: the tests kill it at each of them.
"""
from __future__ import annotations

import hashlib
import io
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ..data.files import atomic_open, fault_point, no_room_error
from ..errors import UserError

__all__ = ["FORMAT", "CHECKPOINT_NAME", "save_checkpoint", "load_checkpoint", "inference_weights"]

FORMAT = "fastqa-checkpoint-1"
CHECKPOINT_NAME = "checkpoint.pt"

_ZIP_START = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"      # signature of the end-of-central-directory record
_ZIP_END_SIZE = 22            # that record without its comment; its last 2 bytes are the comment's length
_MARK = b"fastqa-sha256:"
_TRAILER_SIZE = len(_MARK) + 64


def _with_checksum(archive: bytes | memoryview) -> bytes | memoryview | None:
    """``archive`` (torch.save's bytes) with the checksum comment; None when it does not end as a zip
    archive with no comment does (then it is written without a checksum)."""
    if len(archive) < _ZIP_END_SIZE or bytes(archive[-_ZIP_END_SIZE:-_ZIP_END_SIZE + 4]) != _ZIP_END \
            or bytes(archive[-2:]) != b"\0\0":
        return None
    body = archive[:-2]
    trailer = _MARK + hashlib.sha256(body).hexdigest().encode("ascii")
    return b"".join([body, _TRAILER_SIZE.to_bytes(2, "little"), trailer])


def _verify(data: bytes, path: Path) -> None:
    """Raise a UserError naming ``path`` unless ``data`` carries a matching checksum or is an archive
    written before checksums (an archive with no comment)."""
    if data[-_TRAILER_SIZE:-64] == _MARK:
        body, length = memoryview(data)[:-_TRAILER_SIZE - 2], data[-_TRAILER_SIZE - 2:-_TRAILER_SIZE]
        expected = data[-64:].decode("ascii", errors="replace")
        if length != _TRAILER_SIZE.to_bytes(2, "little") or hashlib.sha256(body).hexdigest() != expected:
            raise UserError(f"{path}: damaged checkpoint: checksum mismatch (the file changed after it was "
                            "written; restore it from a copy or train again)")
        return
    if data[:4] == _ZIP_START and not (data[-_ZIP_END_SIZE:-_ZIP_END_SIZE + 4] == _ZIP_END and data[-2:] == b"\0\0"):
        # A zip archive ending neither in a checksum nor in torch.save's own ending: the end of the file
        # was overwritten or cut off.
        raise UserError(f"{path}: damaged checkpoint: checksum missing or unreadable at the end of the file")


def save_checkpoint(out_dir: str | os.PathLike, payload: dict, name: str = CHECKPOINT_NAME) -> Path:
    """Write ``payload`` (plus the format tag) to ``out_dir/name`` atomically, with its checksum; returns
    the path."""
    path = Path(out_dir) / name
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **payload}, buf)
    archive = buf.getbuffer()
    data = _with_checksum(archive)
    if data is None:
        warnings.warn(f"{path}: torch.save wrote an archive of a layout fastqa does not know; the checkpoint "
                      "is saved without a checksum", RuntimeWarning, stacklevel=2)
        data = archive
    half = len(data) // 2
    with atomic_open(path, "wb") as f:
        try:
            f.write(data[:half])
            f.flush()
            fault_point(f"{path.name}:half")
            f.write(data[half:])
        except OSError as e:
            raise no_room_error(path, e, needed=len(data), what="the checkpoint") or e from None
    return path


def load_checkpoint(path_or_dir: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The payload of a fastqa checkpoint file, or of ``DIR/checkpoint.pt`` when given a folder; a
    ``UserError`` naming the file when it is missing, damaged (checksum mismatch) or not a checkpoint."""
    path = Path(path_or_dir)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint (train a model into that folder first)")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read the checkpoint ({e.strerror})") from None
    _verify(data, path)
    try:
        # weights_only=False: the payload holds plain Python objects (config dicts, vocabularies, RNG states)
        # that the loader of torch>=2.6 would refuse; only load checkpoints you trust, as with torch.load.
        payload: Any = torch.load(io.BytesIO(data), map_location=map_location, weights_only=False)
    except Exception as e:
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        fmt = payload.get("format") if isinstance(payload, dict) else None
        raise UserError(f"{path}: not a fastqa checkpoint (format {fmt!r})")
    return payload


def inference_weights(payload: dict) -> dict:
    """The weights to predict with: the EMA's when the run kept one (the paper evaluates with them)."""
    return payload.get("ema") or payload["model"]
