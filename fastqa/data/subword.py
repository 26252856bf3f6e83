"""Subword vocabularies learned from text with SentencePiece (unigram or BPE), kept as bytes in checkpoints.

:class:`SubwordModel` wraps a ``sentencepiece`` model so that its ids *are* fastqa's ids: ``<pad>`` 0,
``<unk>`` 1, ``<sos>`` 2, ``<eos>`` 3 (the order of the translation vocabularies and ConvS2SConfig's
defaults), then the model's pieces. :meth:`SubwordModel.to_vocab` gives the matching :class:`Vocab`
(pieces in id order), so ``vocab.encode(model.encode(text)) == model.encode_ids(text)``.

What a model promises:

* Cased: nothing is lowercased, and the default normalization (``"identity"``) leaves characters as they
  are, so decoded output uses exactly the characters of the training text.
* No ``<unk>`` from :meth:`~SubwordModel.encode`: with ``byte_fallback`` (the default) and
  ``character_coverage=1.0`` every character of the training text has a piece, and any other character is
  spelled as its UTF-8 bytes (``<0xE6>`` ...), which decode back to the same character.
* ``decode(encode(text)) == text`` for text with single spaces between words and none at either end
  (SentencePiece collapses runs of whitespace).
* Deterministic: the same lines and arguments give the same model bytes (one training thread by
  default; the unigram and BPE trainers split work by thread count, so another count gives another model).

Training runs in memory (no temporary files); :meth:`~SubwordModel.to_bytes` is the serialized model,
:meth:`~SubwordModel.from_bytes` reads it back. Whether one model is learned on both languages (joint) or
one per language is the caller's choice: train on the lines it should cover.
"""
from __future__ import annotations

import hashlib
import io
import operator
import re
from typing import Any, Iterable, Iterator, Sequence

from .._checks import check_bool, check_int, check_number
from .vocab import EOS, PAD, SOS, UNK, Vocab

__all__ = ["SubwordModel", "SPECIALS", "MODEL_TYPES", "NORMALIZATIONS"]

# ids 0..3, in the order fastqa's translation vocabularies use, so pieces and Vocab ids agree.
SPECIALS = (PAD, UNK, SOS, EOS)
MODEL_TYPES = ("unigram", "bpe")
# Case-folding rules are left out on purpose: the output must keep the case of the training text.
NORMALIZATIONS = ("identity", "nfkc", "nmt_nfkc")
_CONTROL = frozenset((PAD, SOS, EOS))


def _spm() -> Any:
    """The sentencepiece module, imported on first use so that ``import fastqa.data`` does not need it."""
    try:
        import sentencepiece
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("subword vocabularies need the sentencepiece package: "
                          "pip install sentencepiece (or fastqa[models])") from e
    return sentencepiece


# A word for restore_case: letters, digits and underscores (a hyphen or an apostrophe separates words)
_WORD = re.compile(r"\w+")
_CASE_CACHE_SIZE = 1 << 16


class SubwordModel:
    """A trained SentencePiece model whose ids match fastqa's specials. Build with :meth:`train` or
    :meth:`from_bytes`."""

    def __init__(self, processor: Any, data: bytes) -> None:
        self._sp = processor
        self._bytes = data
        self._size = int(processor.get_piece_size())
        self._case_cache: dict[str, str] = {}   # restore_case's choice per word

    # -- building ------------------------------------------------------------------------------------

    @classmethod
    def train(cls, lines: Iterable[str], *, vocab_size: int = 8000, model_type: str = "unigram",
              byte_fallback: bool = True, character_coverage: float = 1.0, normalization: str = "identity",
              user_symbols: Sequence[str] = (), seed: int = 0, num_threads: int = 1) -> "SubwordModel":
        """Learn a model from ``lines`` (one sentence each; blank lines are skipped).

        ``vocab_size`` is an upper bound: on text too small to support it the model gets as many pieces as
        the text allows (tiny corpora still train). It must leave room for the 4 specials, the
        ``user_symbols``, the 256 byte pieces (with ``byte_fallback``) and every character kept by
        ``character_coverage``. ``user_symbols`` are pieces that are never split (tags such as ``<de>``);
        they get the ids right after the specials. With ``byte_fallback=False``, a character the model has
        no piece for gets the id of ``<unk>``.
        """
        if isinstance(lines, (str, bytes)) or not isinstance(lines, Iterable):
            raise TypeError(f"lines must be an iterable of str (one sentence each), got {type(lines).__name__}")
        vocab_size = check_int("vocab_size", vocab_size, low=len(SPECIALS) + 1)
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
        check_bool("byte_fallback", byte_fallback)
        character_coverage = check_number("character_coverage", character_coverage, low=0, high=1, low_open=True)
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        symbols = cls._check_symbols(user_symbols)
        seed = check_int("seed", seed, low=0)
        num_threads = check_int("num_threads", num_threads, low=1)

        spm = _spm()
        # The trainer reads the iterator from C++ and turns any Python exception into a RuntimeError, so
        # the checks on the lines record what went wrong here and re-raise it as the right type afterwards.
        seen = {"text": 0}
        errors: list[Exception] = []

        def checked() -> Iterator[str]:
            try:
                for i, line in enumerate(lines):
                    if not isinstance(line, str):
                        errors.append(TypeError(f"lines[{i}] must be a str, got {type(line).__name__}"))
                        return
                    if line.strip():
                        seen["text"] += 1
                        yield line
            except Exception as e:  # an error in the caller's iterable, kept to re-raise unchanged
                errors.append(e)

        writer = io.BytesIO()
        # The library's generator is global; pinning it keeps any sampling it does repeatable.
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=checked(), model_writer=writer, vocab_size=vocab_size, model_type=model_type,
                byte_fallback=byte_fallback, character_coverage=float(character_coverage),
                normalization_rule_name=normalization, user_defined_symbols=list(symbols),
                pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                pad_piece=PAD, unk_piece=UNK, bos_piece=SOS, eos_piece=EOS,
                # a ceiling, not a demand: small corpora give fewer pieces instead of an error
                hard_vocab_limit=False, num_threads=num_threads, minloglevel=2)
        except RuntimeError as e:
            if errors:
                raise errors[0] from None
            if seen["text"] == 0:
                raise ValueError("lines: no text to learn from (every line is empty or blank)") from None
            needed = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(e))
            if needed:
                raise ValueError(
                    f"vocab_size={vocab_size} is too small for this text: it needs at least {needed.group(2)} "
                    f"pieces (the specials, user_symbols, {'256 byte pieces, ' if byte_fallback else ''}"
                    f"and every character kept by character_coverage={character_coverage})") from None
            raise
        if errors:  # the iterator stopped early on a bad line, but training still found enough text
            raise errors[0]
        return cls.from_bytes(writer.getvalue())

    @staticmethod
    def _check_symbols(user_symbols: Sequence[str]) -> tuple[str, ...]:
        if isinstance(user_symbols, str) or not isinstance(user_symbols, Iterable):
            raise TypeError(f"user_symbols must be a sequence of str, got {type(user_symbols).__name__}")
        symbols = tuple(user_symbols)
        for i, s in enumerate(symbols):
            if not isinstance(s, str):
                raise TypeError(f"user_symbols[{i}] must be a str, got {type(s).__name__}")
            if not s or any(c.isspace() for c in s):
                raise ValueError(f"user_symbols[{i}] must be non-empty with no whitespace, got {s!r}")
            if s in SPECIALS:
                raise ValueError(f"user_symbols[{i}]: {s!r} is one of the specials {SPECIALS}")
        if len(set(symbols)) != len(symbols):
            raise ValueError(f"user_symbols has duplicates: {list(symbols)}")
        return symbols

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> "SubwordModel":
        """A model from :meth:`to_bytes` (a serialized SentencePiece model proto with fastqa's specials)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data must be bytes (a serialized SentencePiece model), got {type(data).__name__}")
        data = bytes(data)
        spm = _spm()
        processor = spm.SentencePieceProcessor()
        try:
            processor.load_from_serialized_proto(data)
        except (RuntimeError, OSError) as e:
            raise ValueError(f"data: not a serialized SentencePiece model ({len(data)} bytes): {e}") from None
        n = int(processor.get_piece_size())
        got = tuple(processor.id_to_piece(i) for i in range(min(n, len(SPECIALS))))
        # An id layout other than fastqa's would make Vocab ids and model ids silently disagree.
        if (got != SPECIALS or not processor.is_unknown(1)
                or not all(processor.is_control(i) for i in (0, 2, 3))):
            raise ValueError(f"data: a SentencePiece model whose ids 0..3 are not fastqa's specials {SPECIALS} "
                             f"(got {got}); train it with SubwordModel.train")
        return cls(processor, data)

    def to_bytes(self) -> bytes:
        """The serialized model (what a checkpoint stores); :meth:`from_bytes` reads it back."""
        return self._bytes

    # -- using ---------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[str]:
        """``text`` -> its pieces (no specials added)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self._sp.encode(text, out_type=str))

    def encode_ids(self, text: str) -> list[int]:
        """``text`` -> the ids of its pieces (no specials added); equal to ``to_vocab().encode(encode(text))``."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return list(self._sp.encode(text, out_type=int))

    def decode(self, tokens: Iterable[str | int]) -> str:
        """Pieces (str) or ids (int) -> text. ``<pad>``, ``<sos>`` and ``<eos>`` are dropped, so a model's raw
        output decodes as is; byte pieces are joined back into characters.

        A piece string the model lacks (what :meth:`encode` gives for an unseen character when there is no
        byte fallback) is copied through, as SentencePiece does; the id of such a character is ``<unk>``,
        which decodes to SentencePiece's `` ⁇ ``.
        """
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
            raise TypeError(f"tokens must be a sequence of pieces (str) or ids (int), got {type(tokens).__name__}")
        pieces: list[str] = []
        ids: list[int] = []
        for i, tok in enumerate(tokens):
            if isinstance(tok, str):
                pieces.append(tok)
            else:
                try:
                    j = operator.index(tok)
                except TypeError:
                    raise TypeError(f"tokens[{i}] must be a str piece or an int id, "
                                    f"got {type(tok).__name__}") from None
                if not 0 <= j < self._size:
                    raise ValueError(f"tokens[{i}]: id {j} is out of range for a model of {self._size} pieces")
                ids.append(j)
            if pieces and ids:
                raise TypeError(f"tokens[{i}]: tokens must be all pieces (str) or all ids (int), not a mix")
        if ids:
            return str(self._sp.decode(ids))  # SentencePiece drops the control ids itself
        # Control pieces are dropped first: left in front, they stop SentencePiece from removing the "▁"
        # that marks the first word.
        return str(self._sp.decode_pieces([p for p in pieces if p not in _CONTROL]))

    def restore_case(self, text: str) -> str:
        """``text`` written all in lower case, with the case this model's training text would give it: each
        word capitalised where its capitalised spelling is likelier under the model's pieces (the sum of
        their log-probabilities; a noun of a cased German corpus is one frequent piece capitalised and
        several rare ones not), and the first letter of the text capitalised. Text holding any capital
        letter is returned as it is: its case is the writer's."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if any(ch.isupper() for ch in text):
            return text
        cased = _WORD.sub(lambda m: self._likelier_case(m.group(0)), text)
        first = next((i for i, ch in enumerate(cased) if ch.isalpha()), None)
        return cased if first is None else cased[:first] + cased[first].upper() + cased[first + 1:]

    def _likelier_case(self, word: str) -> str:
        cache = self._case_cache
        if word not in cache:
            if len(cache) >= _CASE_CACHE_SIZE:
                cache.clear()
            capital = word[:1].upper() + word[1:]
            cache[word] = capital if self._log_prob(capital) > self._log_prob(word) else word
        return cache[word]

    def _log_prob(self, text: str) -> float:
        return sum(self._sp.get_score(i) for i in self._sp.encode(text, out_type=int))

    def to_vocab(self) -> Vocab:
        """The :class:`Vocab` of this model's pieces in id order: same ids, fastqa's specials at 0..3."""
        return Vocab([self._sp.id_to_piece(i) for i in range(self._size)])

    def is_byte(self, piece_id: int) -> bool:
        """Whether ``piece_id`` is a byte piece (``<0x..>``): what unseen characters are spelled with."""
        j = operator.index(piece_id)
        if not 0 <= j < self._size:
            raise ValueError(f"piece_id {j} is out of range for a model of {self._size} pieces")
        return bool(self._sp.is_byte(j))

    def fingerprint(self) -> str:
        """sha1 of the serialized model: equal fingerprints mean the same pieces, ids and normalization."""
        return hashlib.sha1(self._bytes).hexdigest()

    def __len__(self) -> int:
        return self._size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubwordModel) and self._bytes == other._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)

    def __getstate__(self) -> dict:
        # The processor is a C++ object: pickle (and copy/deepcopy) carry the bytes and rebuild it.
        return {"data": self._bytes}

    def __setstate__(self, state: dict) -> None:
        other = type(self).from_bytes(state["data"])
        self.__dict__.update(other.__dict__)

    def __repr__(self) -> str:
        return f"SubwordModel(pieces={self._size}, sha1={self.fingerprint()[:10]})"
