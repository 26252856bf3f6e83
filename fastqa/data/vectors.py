"""Pre-trained word vectors in GloVe / fastText text format, and the embedding matrix for a vocabulary.

Format: one word per line, ``word v1 ... vD`` separated by spaces, UTF-8, plain or gzip (detected by
content, not by the name). fastText's ``.vec`` files start with a ``count dim`` header line, GloVe's do
not; both are accepted. Some GloVe files (840B) hold words that contain spaces: the last ``D`` fields
are the vector and everything before them is the word.
"""
from __future__ import annotations

import gzip
import logging
import os
from typing import Iterable

import torch

from ..errors import UserError
from .vocab import Vocab

__all__ = ["read_vectors", "check_vectors_file", "lookup_variants", "vectors_for_vocab"]

log = logging.getLogger("fastqa.data")


def _open_text(path: str):
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return (gzip.open if gz else open)(path, "rt", encoding="utf-8", newline="\n")


def read_vectors(path: str | os.PathLike, *, words: Iterable[str] | None = None,
                 progress: bool = False, max_lines: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """``({word: vector [dim]}, dim)`` from a GloVe/fastText text file.

    words: keep only these words (saves memory for big files); None keeps every word. The first
    occurrence of a word wins. Errors (missing file, a line with the wrong number of fields or a
    field that is not a number) raise UserError naming the file and line. max_lines: stop after that many
    lines (``check_vectors_file`` reads a few to check the format before anything slow happens).
    """
    path = os.fspath(path)
    keep = None if words is None else set(words)
    vectors: dict[str, torch.Tensor] = {}
    dim: int | None = None
    try:
        f = _open_text(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such vectors file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder, expected a word-vectors text file") from None
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(desc=f"reading {os.path.basename(path)}", unit=" lines", mininterval=1.0)
    try:
        with f:
            for lineno, line in enumerate(f, 1):
                if max_lines is not None and lineno > max_lines:
                    break
                if bar is not None:
                    bar.update(1)
                fields = line.rstrip("\r\n").rstrip(" ").split(" ")
                if lineno == 1 and len(fields) == 2 and all(x.isdigit() for x in fields):
                    dim = int(fields[1])  # fastText header "count dim"
                    continue
                if len(fields) == 1 and not fields[0]:
                    continue  # a blank line
                if dim is None:
                    dim = _infer_dim(fields)
                    if dim < 1:
                        raise UserError(f"{path}: line {lineno}: expected 'word v1 ... vD', found no numbers")
                if len(fields) < dim + 1:
                    raise UserError(f"{path}: line {lineno}: {len(fields) - 1} values, expected {dim} "
                                    f"(the vectors' dimension)")
                word = " ".join(fields[:-dim])
                if keep is not None and word not in keep or word in vectors:
                    continue
                try:
                    vectors[word] = torch.tensor([float(x) for x in fields[-dim:]], dtype=torch.float32)
                except ValueError:
                    raise UserError(f"{path}: line {lineno}: a vector value is not a number") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError) as e:
        raise UserError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    finally:
        if bar is not None:
            bar.close()
    if dim is None:
        raise UserError(f"{path}: the vectors file is empty")
    return vectors, dim


def _infer_dim(fields: list[str]) -> int:
    """How many trailing fields of the first line are numbers (the dimension)."""
    n = 0
    for x in reversed(fields[1:]):  # the first field is always (part of) the word
        try:
            float(x)
        except ValueError:
            break
        n += 1
    return n


def lookup_variants(word: str) -> tuple[str, ...]:
    """Spellings to try for ``word`` in a vectors file: as is, lowercase, capitalised, uppercase
    (GloVe 6B is lowercased; a cased vocabulary still finds its vectors)."""
    return tuple(dict.fromkeys((word, word.lower(), word.capitalize(), word.upper())))


def vectors_for_vocab(vocab: Vocab, vectors: dict[str, torch.Tensor] | None, dim: int, *,
                      seed: int = 0, scale: float = 0.1) -> tuple[torch.Tensor, int]:
    """The ``[len(vocab), dim]`` matrix for ``vocab`` and how many words found a pre-trained vector.

    Words without one (and everything, when ``vectors`` is None) get N(0, scale²) random vectors from
    a generator seeded with ``seed``; the ``<pad>`` row is zero. A log line says how many were found.
    """
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(len(vocab), dim, generator=gen) * scale
    found = 0
    if vectors is None:
        log.info("no word vectors given: the %d words get random vectors", len(vocab))
    else:
        for i, word in enumerate(vocab.itos):
            for variant in lookup_variants(word):
                v = vectors.get(variant)
                if v is not None:
                    if v.numel() != dim:
                        raise ValueError(f"vectors[{variant!r}] has {v.numel()} values, expected {dim}")
                    out[i] = v
                    found += 1
                    break
        log.info("word vectors: %d of %d vocabulary words found, the others are random", found, len(vocab))
    if "<pad>" in vocab:
        out[vocab.pad_id] = 0.0
    return out, found


def check_vectors_file(path: str | os.PathLike) -> int:
    """The vectors' dimension, from the first lines of ``path``: a missing file, a folder, damaged gzip or a
    file that is not 'word v1 ... vD' text fails here, in a moment, instead of after the data is read."""
    vectors, dim = read_vectors(path, max_lines=5)
    if not vectors or dim < 1:
        raise UserError(f"{os.fspath(path)}: no word vector in its first lines (expected 'word v1 ... vD' text)")
    return dim
