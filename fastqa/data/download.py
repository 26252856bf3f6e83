"""``fastqa download``: the public data the recipes read, fetched from its publishers and checked by sha256.

::

    fastqa download squad --to data      # data/squad/dev-v1.1.json.gz, dev-v2.0.json.gz, train-v1.1.json.gz
    fastqa download glove --to data      # data/glove/glove.6B.50d.top100k.txt.gz (from the 822 MB glove.6B.zip)
    fastqa download multi30k --to data   # data/multi30k/{train,val,test_2016_flickr}.{de,en}.gz

Each file of ``CATALOGUE`` comes over HTTPS (urllib: no other dependency) into ``FILE.part`` in its dataset's
folder. An interrupted download resumes from the ``.part`` with an HTTP Range request, or starts again from zero
when the server ignores Range (or when a resumed file does not verify). The final name appears only once the
bytes are verified: a sha256 mismatch removes the download and is a ``UserError`` naming the file and both
digests. A file already present and verified is not fetched again (``force=True`` fetches it anyway).
``FASTQA_DOWNLOAD_BASE`` (or ``base_url=``) fetches every file from ``BASE/DATASET/FILE`` instead of its
publisher: a mirror, or a local server in the tests.

Where the catalogue's digests come from (``None`` where no digest is known to us; none was made up):

- SQuAD ``dev-v1.1.json``: the sha256 and size of a byte-identical copy of the official file, also the digest
  other public projects pin for this URL. ``train-v1.1.json`` (sha256 and size) and ``dev-v2.0.json`` (sha256;
  its size is not known to us): the digests other public projects pin for these URLs, not checked against the
  files themselves.
- Multi30k: the sha256 and sizes of the six ``.gz`` files in the multi30k/dataset repository (master), read from
  a copy of that repository; a copy of the files the recipes were run on has the same bytes.
- GloVe: no published sha256 of ``glove.6B.zip`` is known to us, so the archive is checked only by its size
  (862,182,613 bytes, as other public projects record it); the file written is checked by the sha256 of its
  uncompressed text, computed from the ``glove.6B.50d.top100k.txt.gz`` the recipes were run on (the first
  100,000 lines of ``glove.6B.50d.txt``, the archive's 50-dimensional vectors).

None of the URLs was fetched while writing this module (no internet on the machine it was written on).
"""
from __future__ import annotations

import gzip
import hashlib
import logging
import os
import sys
import zipfile
import zlib
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

from ..errors import UserError
from .files import atomic_open

__all__ = ["Entry", "CATALOGUE", "ENV_BASE", "datasets", "entries", "source_url", "download", "recipe_lines"]

log = logging.getLogger(__name__)

#: the environment variable that points every download at a mirror: ``$FASTQA_DOWNLOAD_BASE/DATASET/FILE``
ENV_BASE = "FASTQA_DOWNLOAD_BASE"


@dataclass(frozen=True)
class Entry:
    """One file that ``fastqa download DATASET`` writes to ``DIR/DATASET/name``, and where it comes from.

    The download is checked by ``sha256`` and ``size`` where they are known. Post-processing: ``member``
    extracts that file of a zip download, ``head`` keeps its first N lines, ``gzip`` compresses the result
    (mtime 0 and no file name in the header, so the bytes depend only on the text). A written file that is not
    the download itself is checked by ``output_sha256``, the sha256 of its uncompressed content (when it only
    gzips the download, by the download's sha256).
    """

    dataset: str
    name: str
    url: str
    sha256: str | None
    size: int | None
    licence: str
    gzip: bool = False
    member: str | None = None
    head: int | None = None
    output_sha256: str | None = None
    note: str = ""

    @property
    def source_name(self) -> str:
        """The downloaded file's name: the last part of the URL's path."""
        return self.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]

    @property
    def is_download(self) -> bool:
        """True when the written file is the download itself, byte for byte."""
        return not (self.gzip or self.member or self.head)

    @property
    def content_sha256(self) -> str | None:
        """The sha256 a present file is checked by: of its bytes, or of its uncompressed text."""
        if self.member or self.head:
            return self.output_sha256
        return self.sha256


_SQUAD = "https://rajpurkar.github.io/SQuAD-explorer/dataset"
_SQUAD_LICENCE = "CC BY-SA 4.0 (Rajpurkar et al. 2016, 2018)"
_MULTI30K = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
_MULTI30K_LICENCE = "research use, as distributed by the Multi30k authors (Elliott et al. 2016)"
_GLOVE_LICENCE = "PDDL (Pennington et al. 2014)"

#: every file ``fastqa download`` can write, in the order it fetches them (see the module's docstring for
#: where each digest comes from)
CATALOGUE: tuple[Entry, ...] = (
    Entry("squad", "dev-v1.1.json.gz", f"{_SQUAD}/dev-v1.1.json",
          "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9", 4_854_279, _SQUAD_LICENCE, gzip=True),
    Entry("squad", "dev-v2.0.json.gz", f"{_SQUAD}/dev-v2.0.json",
          "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8", None, _SQUAD_LICENCE, gzip=True,
          note="the v2.0 recipes name dev-v2.0.reconstructed.json.gz: this official file has the same articles "
               "and questions, pass it instead"),
    Entry("squad", "train-v1.1.json.gz", f"{_SQUAD}/train-v1.1.json",
          "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955", 30_288_272, _SQUAD_LICENCE, gzip=True),
    Entry("glove", "glove.6B.50d.top100k.txt.gz", "https://nlp.stanford.edu/data/glove.6B.zip",
          None, 862_182_613, _GLOVE_LICENCE, gzip=True, member="glove.6B.50d.txt", head=100_000,
          output_sha256="af4e215a94cf5a3d0af68378b1faade5aaef67f7b653adfdd2937895c481cdc0"),
    *(Entry("multi30k", f"{split}.{lang}.gz", f"{_MULTI30K}/{split}.{lang}.gz", sha256, size, _MULTI30K_LICENCE)
      for split, lang, sha256, size in (
          ("train", "de", "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6", 637_044),
          ("train", "en", "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f", 568_929),
          ("val", "de", "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a", 24_681),
          ("val", "en", "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28", 21_650),
          ("test_2016_flickr", "de", "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8", 22_890),
          ("test_2016_flickr", "en", "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9", 21_077),
      )),
)

_CHUNK = 1 << 16
_TIMEOUT_S = 60.0  # per blocking socket operation, not for the whole file


def datasets() -> list[str]:
    """The dataset names ``CATALOGUE`` knows, in its order (read at each call, so tests can replace it)."""
    return list(dict.fromkeys(e.dataset for e in CATALOGUE))


def entries(dataset: str) -> list[Entry]:
    """The catalogue's files of ``dataset``; an unknown name is a ``UserError`` listing the known ones."""
    found = [e for e in CATALOGUE if e.dataset == dataset]
    if not found:
        raise UserError(f"{dataset!r} is not a dataset fastqa downloads (known: {', '.join(datasets())})")
    return found


def source_url(entry: Entry, base_url: str | None = None) -> str:
    """Where ``entry`` is fetched from: its publisher's URL, or ``BASE/DATASET/FILE`` with ``base_url`` (or, when
    that is None, ``$FASTQA_DOWNLOAD_BASE``) set."""
    base = base_url if base_url is not None else os.environ.get(ENV_BASE)
    if not base:
        return entry.url
    return f"{base.rstrip('/')}/{entry.dataset}/{entry.source_name}"


def _sha256_file(path: Path, *, gunzip: bool = False) -> str:
    digest = hashlib.sha256()
    with (gzip.open(path, "rb") if gunzip else open(path, "rb")) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _present_and_verified(path: Path, entry: Entry) -> bool | None:
    """True when ``path`` holds the right content, False when it is absent or wrong, None when it is present
    but the catalogue has no digest to check it by."""
    if not path.is_file():
        return False
    expected = entry.content_sha256
    if expected is None:
        return None
    try:
        return _sha256_file(path, gunzip=not entry.is_download) == expected
    except (OSError, EOFError, zlib.error):  # damaged gzip data: not verified, fetched again
        return False


def _progress_bar(progress: bool, desc: str, total: int | None, initial: int) -> Any:
    """A tqdm byte counter on stderr, or a stand-in that counts nothing (progress off, or no tqdm)."""
    if progress:
        try:
            from tqdm.auto import tqdm
        except ImportError:  # tqdm comes with the models extra; without it, no bar
            pass
        else:
            return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                        mininterval=0.5, dynamic_ncols=True, file=sys.stderr)
    return nullcontext(_NoBar())


class _NoBar:
    """What the download loop updates when there is no bar."""

    def update(self, n: int) -> None:
        pass


def _open(url: str, start: int) -> Any:
    """The response to a GET of ``url`` (from byte ``start`` with a Range header when ``start`` > 0), or None
    for 416: the server has no bytes at ``start`` (the ``.part`` is already as long as the file)."""
    import urllib.error
    import urllib.request

    from .._version import __version__

    headers = {"User-Agent": f"fastqa/{__version__} (+fastqa download)"}
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and start:
            return None
        raise UserError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise UserError(f"cannot download {url}: {e.reason}") from None
    except OSError as e:  # a timeout or reset before the headers
        raise UserError(f"cannot download {url}: {e}") from None


def _fetch(url: str, part: Path, *, size: int | None, desc: str, progress: bool) -> None:
    """Bring all the bytes of ``url`` into ``part``, continuing the bytes already there when the server
    honours Range; verifying them is the caller's job."""
    import http.client

    have = part.stat().st_size if part.is_file() else 0
    if size is not None and have >= size:
        if have == size:
            return  # complete: an earlier run stopped between the download and its check
        have = 0  # longer than the file: not a prefix of it
    response = _open(url, have)
    if response is None:
        return  # 416: whatever is there is checked, and fetched again from zero if it does not verify
    with response:
        start = 0
        if have and response.status == 206:
            content_range = response.headers.get("Content-Range", "")
            if content_range.startswith(f"bytes {have}-"):
                start = have
            else:  # a range we did not ask for: ask again for the whole file
                response.close()
                part.unlink()
                return _fetch(url, part, size=size, desc=desc, progress=progress)
        if have and not start:
            log.info("%s: the server ignored the Range request; fetching the whole file again", url)
        length = response.headers.get("Content-Length")
        expected = int(length) if length and length.isdigit() else None
        total = start + expected if expected is not None else size
        got = 0
        part.parent.mkdir(parents=True, exist_ok=True)
        with open(part, "ab" if start else "wb") as out, _progress_bar(progress, desc, total, start) as bar:
            try:
                while True:
                    try:
                        chunk = response.read(_CHUNK)
                    except (OSError, http.client.HTTPException) as e:  # a reset, a timeout, a broken chunk
                        raise UserError(f"{url}: the download broke after {start + got:,} bytes "
                                        f"({e or type(e).__name__}); run the command again to resume it") from None
                    if not chunk:
                        break
                    out.write(chunk)
                    got += len(chunk)
                    bar.update(len(chunk))
            finally:  # what arrived stays in the .part for the next run to resume
                out.flush()
                os.fsync(out.fileno())
    if expected is not None and got < expected:
        # http.client returns a short body without an error when the server closes early.
        raise UserError(f"{url}: the server closed the connection after {start + got:,} of {start + expected:,} "
                        f"bytes; run the command again to resume it")


def _download_problem(part: Path, entry: Entry) -> str | None:
    """What is wrong with ``part`` when it is not the catalogue's download, else None: the two sha256
    digests, or the two sizes where the catalogue has no digest."""
    if entry.sha256 is not None:
        digest = _sha256_file(part)
        return None if digest == entry.sha256 else f"checksum mismatch: expected sha256 {entry.sha256}, got sha256 {digest}"
    if entry.size is not None and part.stat().st_size != entry.size:
        return f"size mismatch: expected {entry.size:,} bytes, got {part.stat().st_size:,} bytes"
    return None


def _download_verified(entry: Entry, part: Path, url: str, final: Path, progress: bool) -> None:
    """Fetch ``entry`` into ``part`` and check it; a resumed download that does not verify is fetched once more
    from zero, a fresh one is a ``UserError`` (and ``part`` is removed)."""
    for fresh in (False, True):
        if fresh:
            part.unlink(missing_ok=True)
        resumed = part.is_file() and part.stat().st_size > 0
        _fetch(url, part, size=entry.size, desc=entry.source_name, progress=progress)
        problem = _download_problem(part, entry)
        if problem is None:
            return
        if not resumed:
            break
        log.info("%s: the resumed download does not verify; fetching it again from the start", part)
    part.unlink(missing_ok=True)
    raise UserError(f"{final}: {problem} (from {url}); the download was removed and nothing was written")


def _write_output(entry: Entry, source: Path, final: Path) -> None:
    """Write ``final`` from the verified download ``source`` (extract, keep the first lines, gzip) and check
    it; on any failure nothing is left at ``final``."""
    digest = hashlib.sha256()
    try:
        with atomic_open(final, "wb") as out:
            packer = gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) if entry.gzip else nullcontext(out)
            with packer as dst, _source_stream(entry, source) as src:
                blocks = iter(src) if entry.head else iter(lambda: src.read(1 << 20), b"")
                for count, block in enumerate(blocks, 1):
                    digest.update(block)
                    dst.write(block)
                    if entry.head and count == entry.head:
                        break
            expected = entry.content_sha256
            if expected is not None and digest.hexdigest() != expected:
                raise UserError(f"{final}: checksum mismatch: expected sha256 {expected} of its text, got "
                                f"{digest.hexdigest()} (made from {source}); the download was removed and nothing was written")
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:  # damaged archive data, found while reading it
        raise UserError(f"{source}: damaged archive ({e}); it was removed, run the command again") from None


@contextmanager
def _source_stream(entry: Entry, source: Path) -> Iterator[IO[bytes]]:
    """The bytes to write: the download itself, or its zip member ``entry.member``."""
    if not entry.member:
        with open(source, "rb") as f:
            yield f
        return
    try:
        archive = zipfile.ZipFile(source)
    except zipfile.BadZipFile as e:
        raise UserError(f"{source}: not a readable zip archive ({e}); it was removed, run the command again") from None
    with archive:
        try:
            member = archive.open(entry.member)
        except KeyError:
            raise UserError(f"{source}: the archive has no {entry.member}; it was removed") from None
        with member:
            yield member


def _fetch_entry(entry: Entry, folder: Path, *, force: bool, progress: bool, base_url: str | None) -> Path:
    """Make ``folder/entry.name`` present and verified; returns its path."""
    final = folder / entry.name
    if not force:
        state = _present_and_verified(final, entry)
        if state:
            log.info("%s: present, sha256 verified", final)
            return final
        if state is None:
            log.info("%s: present (the catalogue has no digest to verify it by)", final)
            return final
        if final.exists():
            log.info("%s: present but does not verify; fetching it again", final)
    url = source_url(entry, base_url)
    part = folder / f"{entry.source_name}.part"
    kept = folder / entry.source_name  # an archive kept between its download and its extraction
    if force:
        part.unlink(missing_ok=True)
        if kept != final:
            kept.unlink(missing_ok=True)
    if entry.is_download:
        log.info("%s: fetching %s", final, url)
        _download_verified(entry, part, url, final, progress)
        os.replace(part, final)  # the final name appears only now, verified
        return final
    if entry.member and kept.is_file() and _download_problem(kept, entry) is None:
        log.info("%s: extracting %s from %s", final, entry.member, kept)
    else:
        log.info("%s: fetching %s", final, url)
        _download_verified(entry, part, url, final, progress)
        if entry.member:
            os.replace(part, kept)  # complete and checked: an interrupted extraction need not fetch it again
    source = kept if entry.member else part
    try:
        _write_output(entry, source, final)
    except UserError:
        source.unlink(missing_ok=True)  # a download that makes a wrong file is not worth keeping
        raise
    source.unlink(missing_ok=True)
    return final


def download(names: str | Iterable[str], to: str | os.PathLike = "data", *, force: bool = False,
             progress: bool | None = None, base_url: str | None = None) -> dict[str, list[Path]]:
    """Fetch the datasets ``names`` ("squad", "glove", "multi30k") into ``to/NAME/``; returns
    {name: [the files written or already there]}.

    force: fetch files that are already present and verified. progress: a byte counter on stderr (default:
    when stderr is a terminal). base_url: fetch from ``BASE/DATASET/FILE`` (default ``$FASTQA_DOWNLOAD_BASE``,
    else each file's publisher).
    """
    names = [names] if isinstance(names, str) else list(dict.fromkeys(names))
    todo = {name: entries(name) for name in names}  # every name checked before anything is fetched
    if progress is None:
        progress = sys.stderr.isatty()
    root = Path(to)
    if root.exists() and not root.is_dir():
        raise UserError(f"{root}: is a file, expected the folder to download into (--to)")
    written: dict[str, list[Path]] = {}
    for name, files in todo.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        log.info("%s: %s", name, "; ".join(dict.fromkeys(e.licence for e in files)))
        written[name] = [_fetch_entry(e, folder, force=force, progress=progress, base_url=base_url) for e in files]
    return written


def recipe_lines(written: dict[str, list[Path]]) -> str:
    """What to tell the recipes: ``NAME=FOLDER`` per dataset (the variable the recipes read, absolute), then
    its files, indented, with a note where the recipes name a file differently."""
    notes = {(e.dataset, e.name): e.note for e in CATALOGUE if e.note}
    lines: list[str] = []
    for name, paths in written.items():
        folder = paths[0].parent.resolve() if paths else None
        lines.append(f"{name.upper()}={folder}")
        for path in paths:
            note = notes.get((name, path.name))
            lines.append(f"  {path.resolve()}" + (f"  # {note}" if note else ""))
    return "\n".join(lines)
