"""Token <-> id vocabularies, saved inside checkpoints so a model directory is self-describing."""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Iterable, Sequence

__all__ = ["Vocab", "PAD", "UNK", "SOS", "EOS"]

PAD, UNK, SOS, EOS = "<pad>", "<unk>", "<sos>", "<eos>"


class Vocab:
    """A fixed list of tokens; ids are positions in it. Unknown tokens map to ``<unk>`` when present."""

    def __init__(self, itos: Sequence[str]) -> None:
        itos = list(itos)
        stoi: dict[str, int] = {}
        for i, tok in enumerate(itos):
            if not isinstance(tok, str):
                raise TypeError(f"itos[{i}] must be a str, got {type(tok).__name__}")
            if tok in stoi:
                raise ValueError(f"itos: token {tok!r} appears twice (ids {stoi[tok]} and {i})")
            stoi[tok] = i
        self.itos = itos
        self.stoi = stoi
        self._unk = stoi.get(UNK)

    @classmethod
    def build(cls, token_lists: Iterable[Iterable[str]], *, min_freq: int = 1, max_size: int | None = None,
              specials: Sequence[str] = (PAD, UNK), extra: Iterable[str] = ()) -> "Vocab":
        """Specials first (in the order given), then ``extra``, then tokens seen at least ``min_freq``
        times, most frequent first (ties alphabetical, so the ids do not depend on the data order).
        ``max_size`` caps the total size, specials included."""
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        itos = list(dict.fromkeys([*specials, *extra]))
        taken = set(itos)
        ranked = sorted((t for t, c in counts.items() if c >= min_freq and t not in taken),
                        key=lambda t: (-counts[t], t))
        itos.extend(ranked)
        if max_size is not None:
            if max_size < len(specials):
                raise ValueError(f"max_size must be >= the {len(specials)} specials, got {max_size}")
            itos = itos[:max_size]
        return cls(itos)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __getitem__(self, token: str) -> int:
        i = self.stoi.get(token, self._unk)
        if i is None:
            raise KeyError(f"token {token!r} is not in the vocabulary, which has no {UNK}")
        return i

    def id_of(self, special: str) -> int:
        """The id of a token that must be present (a special such as ``<pad>``)."""
        if special not in self.stoi:
            raise KeyError(f"the vocabulary has no {special!r}")
        return self.stoi[special]

    @property
    def pad_id(self) -> int:
        return self.id_of(PAD)

    @property
    def unk_id(self) -> int:
        return self.id_of(UNK)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        return [self[t] for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]

    def to_dict(self) -> dict:
        return {"itos": list(self.itos)}

    @classmethod
    def from_dict(cls, d: dict) -> "Vocab":
        if not isinstance(d, dict) or "itos" not in d:
            raise ValueError("not a saved Vocab (expected a dict with 'itos')")
        return cls(d["itos"])

    def fingerprint(self) -> str:
        """sha1 of the token list: equal fingerprints mean the same ids for the same tokens."""
        return hashlib.sha1("\n".join(self.itos).encode("utf-8")).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __repr__(self) -> str:
        head = ", ".join(repr(t) for t in self.itos[:6])
        return f"Vocab(size={len(self)}, [{head}{', ...' if len(self) > 6 else ''}])"
