"""SQuAD v1.1 / v2.0: read, tokenise (character offsets kept), find answer spans, numericalise, batch.

Pipeline, each step cached on disk under a key that changes with the file's content and every setting:

    read_squad(path, articles)     -> the JSON object (articles selected), checked question by question
    load_squad(path, articles)     -> SquadSet: contexts and questions tokenised with spaCy, answer token
                                      spans from ``answer_start``                  (cache: *.tok.pt)
    build_vocabs(train, ...)       -> word and character Vocab
    encode_squad(set, vocabs, ...) -> EncodedSquad: id tensors and targets, training limits applied when
                                      ``train=True``                                (cache: *.enc.pt)
    collate(encoded, indices)      -> QABatch of padded tensors for the model

Answers are located by ``answer_start`` and nothing else: an answer whose text differs from the context at
that offset is counted in ``SquadSet.mismatched`` and logged, and gives no training target (it is never
searched for elsewhere in the context); its gold text still counts for the metric. An ``answer_start``
outside the context is an error naming the question id.

Question ids are strings: an int id in the file is converted to its str when read (so a predictions file,
whose keys are JSON strings, matches it), and an id that appears twice in the selected articles is an
error naming the id and the file. A paragraph whose context is empty or whitespace only has nothing to
answer from: it is skipped with its questions, their count logged as a warning, everywhere (training,
evaluation, prediction, ``qa-eval``), so an evaluation during training never meets one; a selection with
no paragraph left is refused.

Training limits (``Limits``: context 400 tokens, question 50, answer 30, 16 characters per word): a
training context is cut to 400 tokens (its questions whose answer ends beyond that are dropped, as are
answers longer than 30 tokens) and questions are cut to 50 tokens; evaluation and prediction use the full
context and question. Words are cut to 16 characters (``Limits.chars``, the model's ``max_word_len``) in
every path, training or not (``encoding``).
"""
from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from ..._checks import check_int
from ...data.batching import bucket_batches, pad
from ...data.files import read_json
from ...data.tokenize import tokenize
from ...data.vocab import Vocab
from ...errors import UserError
from .encoding import encode_tokens, pad_chars

__all__ = [
    "Limits", "SquadContext", "SquadQuestion", "SquadSet", "EncodedSquad", "QABatch",
    "parse_articles", "read_squad", "load_squad", "build_vocabs", "encode_squad", "collate", "file_digest",
    "NO_TARGET",
]

log = logging.getLogger("fastqa.data")

CACHE_VERSION = 2  # 2: words cut to Limits.chars in evaluation too; blank contexts skipped; str ids
NO_TARGET = -1  # an example without a target the model can learn (see EncodedSquad.starts)


@dataclass(frozen=True)
class Limits:
    """Training-only limits, in tokens (``chars``: characters kept per word)."""

    context: int = 400
    question: int = 50
    answer: int = 30      # last - first token <= 30: the span decoder's i <= j <= i + 30 (0: one-word answers)
    chars: int = 16

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            check_int(f"Limits.{name}", value, low=0 if name == "answer" else 1)


@dataclass
class SquadContext:
    """One paragraph: its text and tokens with their character spans [start, end) in ``text``."""

    text: str
    tokens: list[str]
    offsets: list[tuple[int, int]]
    article: int                      # index of the article in the file
    title: str = ""


@dataclass
class SquadQuestion:
    qid: str
    question: str
    tokens: list[str]
    context: int                      # index into SquadSet.contexts
    answers: list[str]                # every gold answer text (the metric uses them all)
    spans: list[tuple[int, int]]      # token spans [first, last] of the answers that match at answer_start
    is_impossible: bool = False


@dataclass
class SquadSet:
    """A tokenised SQuAD file (or a selection of its articles)."""

    path: str
    version: str
    articles: tuple[int, int]         # the selected articles [start, end) of the file
    contexts: list[SquadContext]
    questions: list[SquadQuestion]
    mismatched: list[tuple[str, str, str]] = field(default_factory=list)  # (qid, answer text, context there)
    unaligned: list[str] = field(default_factory=list)  # qids of answers that cover no token (whitespace)
    dataset: dict = field(default_factory=dict)  # the selected JSON (for the official metric)
    skipped: list[tuple[int, int]] = field(default_factory=list)  # (article, paragraph) of blank contexts
    skipped_questions: list[str] = field(default_factory=list)  # the qids of those paragraphs

    @property
    def v2(self) -> bool:
        return self.version.lstrip("v").startswith("2") or any(q.is_impossible for q in self.questions)


# --------------------------------------------------------------------------------------------- reading

def parse_articles(spec: str | Sequence[int] | None, n_articles: int, *, what: str = "articles") -> tuple[int, int]:
    """``"a:b"`` (also ``"a:"``, ``":b"``, ``"a"``) or ``(a, b)`` -> the article range [a, b) of a file
    with ``n_articles`` articles; None selects all. Errors name the argument and the file's size."""
    if spec is None:
        return 0, n_articles
    if isinstance(spec, str):
        text = spec.strip()
        try:
            if ":" in text:
                a, b = text.split(":", 1)
                start = int(a) if a.strip() else 0
                end = int(b) if b.strip() else n_articles
            else:
                start = int(text)
                end = start + 1
        except ValueError:
            raise UserError(f"{what} {spec!r}: expected START:END article indices, e.g. 0:40") from None
    else:
        try:
            start, end = (int(x) for x in spec)
        except (TypeError, ValueError):
            raise UserError(f"{what} {spec!r}: expected (start, end) article indices") from None
    if not 0 <= start < end <= n_articles:
        raise UserError(f"{what} {spec!r}: the file has {n_articles} articles (0:{n_articles}); "
                        f"the selection must be a non-empty range inside it")
    return start, end


def _expect(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise UserError(f"{where}: missing {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int to isinstance; true/false is never a valid offset or id.
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UserError(f"{where}: {key!r} must be of type {names}, got {type(value).__name__}")
    return value


def read_squad(path: str | os.PathLike, articles: str | Sequence[int] | None = None) -> dict:
    """The SQuAD JSON of ``path`` (plain or gzip) with only the selected articles, structure checked.

    Returns ``{"version": ..., "data": [articles...], "articles": [start, end], "skipped": [(article,
    paragraph)...], "skipped_questions": [qid...]}``. Question ids come back as str (an int id becomes its
    str). A paragraph whose context is empty or whitespace only is left out of ``data`` with its questions
    (listed under ``skipped*`` and logged as one warning with the count); the article itself stays, so
    article indices keep their meaning.

    Raises UserError for a missing file, a damaged gzip file, malformed or too deeply nested JSON (line
    and column), a missing field (article, paragraph and question id), a question id that appears twice
    in the selected articles (both places), an ``answer_start`` outside its context (question id), and a
    selection in which every paragraph has a blank context.
    """
    path = os.fspath(path)
    obj = read_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        raise UserError(f"{path}: not a SQuAD file (expected a JSON object with a 'data' list of articles)")
    start, end = parse_articles(articles, len(obj["data"]))
    selected = []
    seen: dict[str, str] = {}             # qid -> where it was first seen
    skipped: list[tuple[int, int]] = []
    skipped_questions: list[str] = []
    n_paragraphs = 0
    for a, article in enumerate(obj["data"][start:end], start):
        where = f"{path}: article {a}"
        kept = []
        for p, paragraph in enumerate(_expect(article, "paragraphs", list, where)):
            n_paragraphs += 1
            pwhere = f"{where}, paragraph {p}"
            context = _expect(paragraph, "context", str, pwhere)
            blank = not context.strip()
            for qa in _expect(paragraph, "qas", list, pwhere):
                qid = qa["id"] = str(_expect(qa, "id", (str, int), pwhere))
                if qid in seen:
                    raise UserError(f"{path}: question id {qid!r} appears twice ({seen[qid]} and "
                                    f"article {a}, paragraph {p}); ids must be unique")
                seen[qid] = f"article {a}, paragraph {p}"
                qwhere = f"{path}: question {qid!r}"
                _expect(qa, "question", str, qwhere)
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise UserError(f"{qwhere}: 'is_impossible' must be true or false")
                qa.setdefault("answers", [])  # a test file without answers can still be predicted
                for k, answer in enumerate(_expect(qa, "answers", list, qwhere)):
                    awhere = f"{qwhere}, answer {k}"
                    text = _expect(answer, "text", str, awhere)
                    s = _expect(answer, "answer_start", int, awhere)
                    # A blank paragraph is skipped whole below; its offsets have nothing to point into.
                    if not blank and (s < 0 or s + len(text) > len(context)):
                        raise UserError(f"{awhere}: answer_start {s} (+ {len(text)} characters) is out of "
                                        f"range for its context of {len(context)} characters")
                if impossible and qa["answers"]:
                    raise UserError(f"{qwhere}: is_impossible is true but the question has answers")
            if blank:
                skipped.append((a, p))
                skipped_questions.extend(qa["id"] for qa in paragraph["qas"])
            else:
                kept.append(paragraph)
        selected.append({**article, "paragraphs": kept})
    if skipped:
        _warn_skipped(path, skipped, skipped_questions)
        if len(skipped) == n_paragraphs:
            raise UserError(f"{path}: every paragraph of articles {start}:{end} has an empty context; "
                            f"there is nothing to read")
    return {"version": str(obj.get("version", "")), "data": selected, "articles": [start, end],
            "skipped": skipped, "skipped_questions": skipped_questions}


def _warn_skipped(path: str, skipped: list[tuple[int, int]], questions: list[str]) -> None:
    a, p = skipped[0]
    n = len(skipped)
    log.warning("%s: skipped %d paragraph%s with an empty context and %d question%s on %s (first: article %d, "
                "paragraph %d)", path, n, "s" if n != 1 else "", len(questions), "s" if len(questions) != 1 else "",
                "them" if n != 1 else "it", a, p)


def file_digest(path: str | os.PathLike) -> str:
    """sha1 of the file's bytes (the data part of every cache key)."""
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cache_key(parts: dict) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()[:20]


def _cache_load(path: Path | None) -> Any:
    if path is None or not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a stale or damaged cache file is rebuilt, never trusted
        log.warning("ignoring unreadable cache file %s (%s)", path, e)
        return None


def _cache_save(path: Path | None, obj: Any) -> None:
    if path is None:
        return
    from ...data.files import atomic_open

    try:
        with atomic_open(path, "wb") as f:
            torch.save(obj, f)
    except OSError as e:  # a read-only cache folder costs time, not correctness
        log.warning("could not write the cache file %s (%s)", path, e)


def _tokenizer_id() -> str:
    import spacy

    return f"spacy-{spacy.__version__}-blank-en"


def _answer_span(offsets: list[tuple[int, int]], starts: list[int], a: int, b: int) -> tuple[int, int] | None:
    """Tokens [first, last] overlapping the characters [a, b); None when no token does."""
    first = bisect.bisect_right([e for _, e in offsets], a)  # first token ending after a
    last = bisect.bisect_left(starts, b) - 1                  # last token starting before b
    if first >= len(offsets) or last < first:
        return None
    return first, last


def load_squad(path: str | os.PathLike, articles: str | Sequence[int] | None = None, *,
               cache_dir: str | os.PathLike | None = None, progress: bool = True) -> SquadSet:
    """Read and tokenise a SQuAD file (selected articles), finding each answer's token span.

    cache_dir: where tokenised files are cached (None: no cache). The key is the file's sha1, the
    article range and the tokenizer version.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"{path}: no such file")
    cache_file = None
    if cache_dir is not None:
        key = _cache_key({"v": CACHE_VERSION, "sha1": file_digest(path), "articles": str(articles),
                          "tok": _tokenizer_id()})
        cache_file = Path(cache_dir) / f"squad-{key}.tok.pt"
        cached = _cache_load(cache_file)
        if isinstance(cached, SquadSet):
            cached.path = path
            if cached.skipped:  # read_squad, which warns about them, did not run
                _warn_skipped(path, cached.skipped, cached.skipped_questions)
            _report(cached)
            return cached
    dataset = read_squad(path, articles)
    contexts: list[SquadContext] = []
    questions: list[SquadQuestion] = []
    mismatched: list[tuple[str, str, str]] = []
    unaligned: list[str] = []
    paragraphs = [(a, art.get("title", ""), p) for a, art in enumerate(dataset["data"], dataset["articles"][0])
                  for p in art["paragraphs"]]
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(paragraphs), desc=f"tokenising {os.path.basename(path)}", unit=" paragraphs",
                   mininterval=1.0)
    for a, title, paragraph in paragraphs:
        text = paragraph["context"]
        toks = tokenize(text)
        offsets = [(s, s + len(t)) for t, s in toks]
        starts = [s for s, _ in offsets]
        contexts.append(SquadContext(text, [t for t, _ in toks], offsets, a, str(title)))
        for qa in paragraph["qas"]:
            qid = qa["id"]  # read_squad made every id a str
            spans = []
            for answer in qa["answers"]:
                s, answer_text = answer["answer_start"], answer["text"]
                found = text[s:s + len(answer_text)]
                if found != answer_text:
                    mismatched.append((qid, answer_text, found))
                    continue
                span = _answer_span(offsets, starts, s, s + len(answer_text))
                if span is None:
                    unaligned.append(qid)
                else:
                    spans.append(span)
            questions.append(SquadQuestion(
                qid=qid, question=qa["question"], tokens=[t for t, _ in tokenize(qa["question"])],
                context=len(contexts) - 1, answers=[x["text"] for x in qa["answers"]], spans=spans,
                is_impossible=bool(qa.get("is_impossible", False)) or not qa["answers"] and _v2(dataset)))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    result = SquadSet(path, dataset["version"], tuple(dataset["articles"]), contexts, questions, mismatched,
                      unaligned, {"version": dataset["version"], "data": dataset["data"]},
                      dataset["skipped"], dataset["skipped_questions"])
    _cache_save(cache_file, result)
    _report(result)
    return result


def _v2(dataset: dict) -> bool:
    return str(dataset.get("version", "")).lstrip("v").startswith("2")


def _report(s: SquadSet) -> None:
    a, b = s.articles
    log.info("%s: articles %d:%d, %d paragraphs, %d questions%s", s.path, a, b, len(s.contexts), len(s.questions),
             f" ({sum(q.is_impossible for q in s.questions)} unanswerable)" if s.v2 else "")
    if s.mismatched:
        ids = ", ".join(dict.fromkeys(q for q, _, _ in s.mismatched[:5]))
        log.warning("%s: %d answers' text differs from the context at answer_start (questions %s%s); they "
                    "give no training target", s.path, len(s.mismatched), ids, ", ..." if len(s.mismatched) > 5 else "")
    if s.unaligned:
        log.warning("%s: %d answers cover no token (whitespace only; questions %s); they give no training target",
                    s.path, len(s.unaligned), ", ".join(s.unaligned[:5]))


# ------------------------------------------------------------------------------------------ vocabularies

def build_vocabs(train: SquadSet, *, others: Sequence[SquadSet] = (), has_vector: Callable[[str], bool] | None = None,
                 min_word_freq: int = 1, min_char_freq: int = 1) -> tuple[Vocab, Vocab]:
    """(word vocab, char vocab), both ``<pad>`` 0, ``<unk>`` 1.

    Without vectors (``has_vector`` None) the words are the training tokens seen ``min_word_freq`` times.
    With vectors, the words are the tokens of ``train`` and ``others`` that have a pre-trained vector
    (the vectors are frozen, so a word of the evaluation text costs nothing to learn and nothing leaks);
    every other word maps to the trainable ``<unk>``. Characters come from the training tokens.
    """
    def token_lists(s: SquadSet) -> Iterable[list[str]]:
        yield from (c.tokens for c in s.contexts)
        yield from (q.tokens for q in s.questions)

    if has_vector is None:
        words = Vocab.build(token_lists(train), min_freq=min_word_freq)
    else:
        def with_vectors() -> Iterable[list[str]]:
            for s in (train, *others):
                for tokens in token_lists(s):
                    yield [t for t in tokens if has_vector(t)]
        words = Vocab.build(with_vectors(), min_freq=min_word_freq)
    chars = Vocab.build((list(t) for tokens in token_lists(train) for t in tokens), min_freq=min_char_freq)
    return words, chars


# ------------------------------------------------------------------------------------------ numericalise

@dataclass
class EncodedSquad:
    """Model inputs for a SquadSet. Contexts are stored once and shared by their questions.

    ``examples[i]`` is the index into ``source.questions`` of encoded example i (training drops some);
    ``starts/ends[i]``: the target in the model's output positions (with a no-answer option, index 0 is
    "no answer" and token t is t + 1), NO_TARGET when the example has none (evaluation only).
    """

    ctx_words: list[torch.Tensor]      # per context [n]
    ctx_chars: list[torch.Tensor]      # per context [n, W]
    q_words: list[torch.Tensor]        # per example [m]
    q_chars: list[torch.Tensor]        # per example [m, W]
    example_ctx: list[int]
    examples: list[int]
    starts: list[int]
    ends: list[int]
    dropped: dict[str, int]
    word_pad: int = 0
    char_pad: int = 0

    def __len__(self) -> int:
        return len(self.examples)

    def lengths(self) -> list[int]:
        """Context length of each example (for length-bucketed batches)."""
        return [len(self.ctx_words[c]) for c in self.example_ctx]

    def batches(self, batch_size: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = True) -> list[list[int]]:
        return bucket_batches(self.lengths(), batch_size, seed=seed, epoch=epoch, shuffle=shuffle)


def encode_squad(data: SquadSet, words: Vocab, chars: Vocab, *, train: bool, no_answer: bool = False,
                 limits: Limits = Limits(), cache_dir: str | os.PathLike | None = None) -> EncodedSquad:
    """Numericalise ``data`` for a model with these vocabularies (cached under a key of everything).

    train=True applies the context, question and answer ``limits`` and keeps only examples with a target:
    answerable questions with a matching answer inside the cut context whose last - first token is at most
    ``limits.answer``, and, when ``no_answer``, unanswerable ones (target 0 = no answer). Dropped examples
    are counted by reason in ``dropped`` and logged. Words are cut to ``limits.chars`` characters whatever
    ``train`` is.
    """
    cache_file = None
    if cache_dir is not None:
        key = _cache_key({"v": CACHE_VERSION, "sha1": file_digest(data.path), "articles": list(data.articles),
                          "tok": _tokenizer_id(), "words": words.fingerprint(), "chars": chars.fingerprint(),
                          "train": train, "no_answer": no_answer, "limits": asdict(limits)})
        cache_file = Path(cache_dir) / f"squad-{key}.enc.pt"
        cached = _cache_load(cache_file)
        if isinstance(cached, EncodedSquad):
            return cached
    char_limit = limits.chars  # in every path: see the module docstring
    ctx_limit = limits.context if train else None
    ctx_words, ctx_chars = [], []
    for c in data.contexts:
        w, ch = encode_tokens(c.tokens[:ctx_limit], words, chars, char_limit)
        ctx_words.append(w)
        ctx_chars.append(ch)
    shift = 1 if no_answer else 0
    enc = EncodedSquad(ctx_words, ctx_chars, [], [], [], [], [], [],
                       {"no matching answer": 0, "unanswerable": 0, "answer beyond context limit": 0,
                        "answer too long": 0}, words.pad_id, chars.pad_id)
    for i, q in enumerate(data.questions):
        if q.is_impossible:
            target = (0, 0) if no_answer else None
            reason = "unanswerable"
        elif not q.spans:
            target, reason = None, "no matching answer"
        else:
            s, e = q.spans[0]  # the first gold answer is the training target
            target, reason = (s + shift, e + shift), ""
            if train and e >= limits.context:
                target, reason = None, "answer beyond context limit"
            elif train and e - s > limits.answer:
                target, reason = None, "answer too long"
        if target is None:
            if train:
                enc.dropped[reason] += 1
                continue
            target = (NO_TARGET, NO_TARGET)
        qw, qc = encode_tokens(q.tokens[:limits.question] if train else q.tokens, words, chars, char_limit)
        enc.q_words.append(qw)
        enc.q_chars.append(qc)
        enc.example_ctx.append(q.context)
        enc.examples.append(i)
        enc.starts.append(target[0])
        enc.ends.append(target[1])
    if train and any(enc.dropped.values()):
        log.info("%s: training on %d of %d questions (left out: %s)", data.path, len(enc), len(data.questions),
                 ", ".join(f"{n} {k}" for k, n in enc.dropped.items() if n))
    _cache_save(cache_file, enc)
    return enc


# ------------------------------------------------------------------------------------------------ batches

@dataclass
class QABatch:
    """Padded model inputs of a batch (all LongTensors) and where they came from."""

    context_words: torch.Tensor   # [B, n]
    context_chars: torch.Tensor   # [B, n, W]
    question_words: torch.Tensor  # [B, m]
    question_chars: torch.Tensor  # [B, m, W']
    starts: torch.Tensor          # [B] target positions (NO_TARGET: none)
    ends: torch.Tensor            # [B]
    indices: list[int]            # example indices into the EncodedSquad

    def to(self, device: torch.device | str) -> "QABatch":
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return QABatch(move(self.context_words), move(self.context_chars), move(self.question_words),
                       move(self.question_chars), move(self.starts), move(self.ends), self.indices)

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.context_words, self.context_chars, self.question_words, self.question_chars


def collate(enc: EncodedSquad, indices: Sequence[int]) -> QABatch:
    """The padded batch of examples ``indices`` of ``enc``."""
    ctx = [enc.example_ctx[i] for i in indices]
    return QABatch(
        context_words=pad([enc.ctx_words[c].tolist() for c in ctx], enc.word_pad),
        context_chars=pad_chars([enc.ctx_chars[c] for c in ctx], enc.char_pad),
        question_words=pad([enc.q_words[i].tolist() for i in indices], enc.word_pad),
        question_chars=pad_chars([enc.q_chars[i] for i in indices], enc.char_pad),
        starts=torch.tensor([enc.starts[i] for i in indices], dtype=torch.long),
        ends=torch.tensor([enc.ends[i] for i in indices], dtype=torch.long),
        indices=list(indices),
    )
