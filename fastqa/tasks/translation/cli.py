"""Translation subcommands: ``mt-train``, ``translate``, ``mt-eval``.

Heavy imports (torch models, spaCy, sacrebleu) happen inside the ``run_*`` functions so ``fastqa --help``
stays quick.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterator, TextIO

from ..flags import (add_commands, add_runtime_flags, add_skip_bad_lines_flag, add_training_flags, amp_of,
                     cuda_graphs_of,
                     check_training_flags, counted, positive_float, probability, resolve_device)

LAYERS = ("fast", "reference")

# The choices of mt-train --vocab (the first is the default); parallel.VOCABS, without importing torch here.
VOCABS = ("subword", "word")
DEFAULT_VOCAB_SIZE = 8000
DEFAULT_MIN_FREQ = 2

__all__ = ["register"]


def _decoding_args(p: argparse.ArgumentParser, default_beam: int) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bar while a batch of sentences decodes")
    p.add_argument("--model", metavar="DIR", default=None,
                   help="a run folder of mt-train, an export of one (fastqa export), or a shipped model's name "
                   "(default: the shipped de->en translator)")
    p.add_argument("--beam", type=counted("beam"), default=default_beam,
                   help=f"beam size; 1 decodes greedily (default {default_beam})")
    p.add_argument("--no-incremental", action="store_true",
                   help="re-run the decoder over the whole prefix at every step (slow; for comparison)")
    p.add_argument("--len-penalty", type=counted("len_penalty"), default=1.0, help="beam score = log-prob / length**this")
    p.add_argument("--max-len-a", type=counted("max_len_a"), default=1.2, help="max output length = a * source length + b")
    p.add_argument("--max-len-b", type=counted("max_len_b"), default=10)
    p.add_argument("--batch-size", type=counted("batch_size"), default=64, help="sentences decoded together")
    p.add_argument("--layers", choices=LAYERS, default=None,
                   help="fastqa's fused layers (fast, default) or the pure-PyTorch reference layers (same weights)")
    p.add_argument("--keep-case", action="store_true",
                   help="read a sentence typed all in lower case as it is (default: a cased model restores its "
                        "case first, as its training text had it)")
    add_runtime_flags(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    add_commands(subparsers, (
        ("mt-train", _mt_train_flags, run_train, "train a ConvS2S translation model on parallel text"),
        ("translate", _translate_flags, run_translate, "translate sentences (stdin or --input) with a trained model"),
        ("mt-eval", _mt_eval_flags, run_eval,
         "sacreBLEU and chrF of a trained model (or of a translation file) on a test set"),
    ))


def _mt_train_flags(p: argparse.ArgumentParser) -> None:
    """Train a ConvS2S model (Gehring et al. 2017) on parallel text, one sentence per line (plain or .gz). By
    default the model reads and writes the pieces of a SentencePiece model learned on the training text (cased;
    never <unk>); --vocab word gives the tutorial's lowercased spaCy words. Works under torchrun (DDP)."""
    p.add_argument("--src", required=True, help="training source sentences")
    p.add_argument("--tgt", required=True, help="training target sentences (same line count)")
    p.add_argument("--valid-src", required=True)
    p.add_argument("--valid-tgt", required=True)
    p.add_argument("--src-lang", help="spaCy language of the source (default: from the file name, train.de.gz -> de)")
    p.add_argument("--tgt-lang", help="spaCy language of the target (default: from the file name)")
    p.add_argument("--vocab", choices=VOCABS, default=VOCABS[0],
                   help="subword (default): one SentencePiece unigram model learned on source and target together, "
                   "cased; word: spaCy tokens with a vocabulary per side, lowercased (the tutorial's)")
    p.add_argument("--vocab-size", type=counted("vocab_size"), default=None, metavar="N",
                   help=f"--vocab subword: at most N pieces (default {DEFAULT_VOCAB_SIZE})")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--lowercase", dest="lowercase", action="store_const", const=True, default=None,
                      help="lowercase the text (the default for --vocab word)")
    case.add_argument("--no-lowercase", dest="lowercase", action="store_const", const=False,
                      help="keep case (the default for --vocab subword)")
    p.add_argument("--min-freq", type=counted("min_freq"), default=None,
                   help=f"--vocab word: tokens seen at least this often (default {DEFAULT_MIN_FREQ})")
    p.add_argument("--preset", choices=("small", "tutorial"), default="small")
    p.add_argument("--max-len", type=counted("max_len"),
                   help="drop training pairs longer than this (tokens or pieces + <eos>)")
    p.add_argument("--optimizer", choices=("adam", "nag"), default="adam",
                   help="adam (the tutorial) or nag: SGD with Nesterov momentum 0.99 (fairseq fconv)")
    p.add_argument("--lr", type=positive_float, help="learning rate (default: adam 1e-3, nag 0.25)")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--valid-bleu", type=counted("valid_bleu"), default=0, metavar="N",
                   help="also greedy tokenized BLEU on the first N validation pairs at each evaluation")
    add_training_flags(p, clip=0.1, eval_every=0, batch_size=64, layers=LAYERS,
                       eval_every_help="steps between evaluations (default 0: at the end of each epoch)")


def _translate_flags(p: argparse.ArgumentParser) -> None:
    """Read one sentence per line, write one translation per line (empty lines stay empty). From a terminal or a
    pipe each line is answered as soon as it is read; a file (--input, or stdin redirected from a file) is
    translated in batches of --batch-size. --nbest N writes N lines per sentence,
    H-<line><TAB><score><TAB><text> (score: log-probability / length**len-penalty, best first); --json writes one
    JSON object per line: {"source", "hypotheses": [{"text", "score", "tokens", "log_prob", "unsure", "entropy"},
    ...]} (and "attention" with --attention). With a fitted confidence floor, stderr names the lines whose
    translation the model is unsure of ("unsure": true in the JSON)."""
    _decoding_args(p, default_beam=5)
    p.add_argument("--input", metavar="F", help="sentences to translate, in batches (default: stdin, line by line)")
    add_skip_bad_lines_flag(p, what="answer a line that is not UTF-8 text with an empty line and go on")
    p.add_argument("--nbest", type=counted("nbest"), metavar="N",
                   help="write the N (<= --beam) best translations of each sentence with their scores")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per input line: the source and its hypotheses (text, score, tokens, "
                   "unsure)")
    p.add_argument("--attention", action="store_true",
                   help="with --json: add the best hypothesis's attention weights (target x source tokens)")
    p.add_argument("--tokenized", action="store_true",
                   help="write the model's tokens separated by spaces instead of detokenized text")
    p.add_argument("--plot-attention", metavar="OUT.png",
                   help="draw the source x target attention map of the first non-empty sentence")


def _mt_eval_flags(p: argparse.ArgumentParser) -> None:
    """Translate --src with --model, or take the translations of --hyp, and score them against --ref: sacreBLEU
    and chrF with sacrebleu's default signatures (cased, 13a; --lowercase: case-insensitive) on detokenized text,
    and the tutorial's tokenized BLEU (lowercased spaCy tokens) as a secondary figure."""
    _decoding_args(p, default_beam=5)
    p.add_argument("--src", help="source sentences (with --model)")
    p.add_argument("--ref", required=True, help="reference translations (same line count)")
    p.add_argument("--hyp", metavar="F",
                   help="score the translations in F (one per line) instead of translating: no --model or --src")
    p.add_argument("--lowercase", action="store_true", help="case-insensitive sacreBLEU and chrF (case:lc)")
    p.add_argument("--tgt-lang", metavar="LANG",
                   help="spaCy language of the references for the tokenized BLEU (default: the model's, else "
                   "from --ref's file name, else spaCy's language-neutral tokenizer)")
    p.add_argument("--output", metavar="F", help="also write the translations (detokenized) here")
    p.add_argument("--json", metavar="F",
                   help="also write the scores (with chrF and the signatures) and the decoding speed as JSON here")
    p.add_argument("--fit-confidence", type=probability, metavar="Q", nargs="?", const=0.05, default=None,
                   help="--src being a validation set: write MODEL/confidence.json, the log-probability per "
                   "token under which, and the next-token entropy over which, the Q (default 0.05) least sure of "
                   "these translations fall; `translate` then flags a translation past either as unsure")


def run_train(args: argparse.Namespace) -> int:
    from ...errors import UserError
    from ...train.loop import TrainSettings
    from .task import MTOptions, train_translation

    check_training_flags(args)
    if args.vocab == "word" and args.vocab_size is not None:
        raise UserError("--vocab-size sets the pieces of --vocab subword; a word vocabulary is set by --min-freq")
    if args.vocab == "subword" and args.min_freq is not None:
        raise UserError("--min-freq sets the words of --vocab word; a subword vocabulary is set by --vocab-size")
    device = resolve_device(args.device)
    amp = amp_of(args.precision, device)
    graphs = cuda_graphs_of(args.cuda_graphs, device)
    overrides = dict(args.overrides)
    for key in ("src_vocab_size", "tgt_vocab_size"):
        if key in overrides:
            raise UserError(f"--set {key}=...: the vocabulary sizes are set from the data")
    opts = MTOptions(src=args.src, tgt=args.tgt, valid_src=args.valid_src, valid_tgt=args.valid_tgt,
                     src_lang=args.src_lang, tgt_lang=args.tgt_lang, vocab=args.vocab,
                     vocab_size=args.vocab_size or DEFAULT_VOCAB_SIZE, lowercase=args.lowercase,
                     min_freq=args.min_freq or DEFAULT_MIN_FREQ, preset=args.preset, config_overrides=overrides,
                     layers=args.layers or "fast", max_len=args.max_len, batch_size=args.batch_size,
                     optimizer=args.optimizer, lr=args.lr, label_smoothing=args.label_smoothing,
                     valid_bleu=args.valid_bleu, seed=args.seed)
    epochs = args.epochs
    settings = TrainSettings(out_dir=args.out, max_steps=args.max_steps, epochs=epochs,
                             clip_norm=args.clip or None, eval_every=args.eval_every, log_every=args.log_every,
                             seed=args.seed, amp=amp, resume=args.resume,
                             progress=not args.no_progress, max_minutes=args.max_minutes, save_every_minutes=args.save_every_minutes or None, device=device,
                             cuda_graphs=graphs)
    metrics = train_translation(opts, settings)
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 reports
        print(json.dumps(metrics))
    return 0


def _load(args: argparse.Namespace):
    from .translator import Translator

    return Translator.load(args.model, layers=args.layers or "fast", device=resolve_device(args.device),
                           precision=args.precision, restore_case=not args.keep_case)


def _decode_kwargs(args: argparse.Namespace, *, progress: bool = True) -> dict:
    return dict(beam=args.beam, incremental=not args.no_incremental, len_penalty=args.len_penalty,
                max_len_a=args.max_len_a, max_len_b=args.max_len_b, batch_size=args.batch_size,
                progress=progress and not args.no_progress)


def _speed_line(stats, args: argparse.Namespace) -> str:
    s = max(stats.seconds, 1e-9)
    mode = "greedy" if args.beam == 1 else f"beam {args.beam}"
    how = "full recompute" if args.no_incremental else "incremental"
    return (f"decoded {stats.sentences} sentences ({stats.tokens} tokens) in {stats.seconds:.2f} s, {mode}, "
            f"{how}: {stats.sentences / s:.1f} sentences/s, {stats.tokens / s:.1f} tokens/s")


def _check_translate_flags(args: argparse.Namespace) -> None:
    from ...errors import UserError

    if args.nbest is not None and args.nbest > args.beam:
        raise UserError(f"--nbest {args.nbest} must be <= --beam ({args.beam})")
    if args.attention and not args.json:
        raise UserError("--attention adds the attention weights to the --json output; pass --json too")


def _render(translator, args: argparse.Namespace, lines: list[str], first: int, *, progress: bool,
            attention: bool = False) -> tuple[list[str], list]:
    """(the output lines, the Translations) for input ``lines`` (line ``first`` of the input is ``lines[0]``):
    one output line per input line, or with --nbest (plain) N per non-empty input line; with --json one JSON
    object per input line. ``attention``: the translations carry their maps (--plot-attention draws one)."""
    results = translator.translate(lines, nbest=args.nbest or 1, attention=args.attention or attention,
                                   **_decode_kwargs(args, progress=progress))

    def text(t) -> str:
        return " ".join(t.tokens) if args.tokenized else t.text
    if not (args.json or args.nbest is not None):
        return [text(t) for t in results], results
    out: list[str] = []
    for i, (line, best) in enumerate(zip(lines, results), start=first):
        # An empty input line has no hypothesis; a sentence whose best translation is empty still has its N.
        hyps = [best, *best.alternatives] if translator.source_tokens(line) else []
        if args.json:
            obj: dict = {"source": line, "hypotheses": []}
            for h in hyps:
                d = h.to_dict()
                del d["alternatives"], d["attention"]
                d["text"] = text(h)
                obj["hypotheses"].append(d)
            if args.attention and best.attention is not None:
                obj["attention"] = best.attention.to_dict()
            out.append(json.dumps(obj, ensure_ascii=False))
        elif not hyps:
            out.append("")  # an empty input line: an empty output line, as without --nbest
        else:
            out += [f"H-{i}\t{h.score:.4f}\t{text(h)}" for h in hyps]
    return out, results


#: the unsure lines the summary names one by one; past them it says how many more
_UNSURE_NAMED = 20


class _Unsure:
    """The input lines whose translation the model is unsure of (``Translation.unsure``), named on stderr: each
    one as it comes when lines are read one at a time (``stream``), and all of them in the closing summary (the
    first ``_UNSURE_NAMED``, then how many more)."""

    def __init__(self, translator, *, stream: bool = False) -> None:
        self.floor, self.translator, self.stream = translator.confidence_floor, translator, stream
        self.lines: list[int] = []
        self.total = 0

    def check(self, lines: list[str], results: list, first: int) -> None:
        if self.floor is None:
            return
        for number, (line, t) in enumerate(zip(lines, results), start=first):
            if not self.translator.source_tokens(line):
                continue
            self.total += 1
            if t.unsure:
                self.lines.append(number)
                if self.stream:
                    print(f"fastqa: warning: line {number}: the model is unsure of this translation", file=sys.stderr)

    def _rule(self) -> str:
        floor = self.floor
        rule = f"log-probability per token under {floor.score:.2f}"
        if floor.entropy is not None:
            rule += f" or next-token entropy over {floor.entropy:.2f}"
        return (f"{rule}, where all but {floor.quantile:.0%} of its validation sentences are: it may not know this "
                "kind of text")

    def summary(self) -> None:
        if not self.lines:
            return
        named = ", ".join(map(str, self.lines[:_UNSURE_NAMED]))
        more = len(self.lines) - _UNSURE_NAMED
        if more > 0:
            named += f" ... and {more} more"
        which = f"line {named}" if len(self.lines) == 1 else f"lines {named}"
        print(f"fastqa: warning: the model is unsure of {len(self.lines)} of {self.total} translations ({which}): "
              f"{self._rule()}", file=sys.stderr)


def run_translate(args: argparse.Namespace) -> int:
    from ...data.files import decode_lines, read_bytes
    from ...errors import UserError
    from ...plots import figure_format, plot_attention_map
    from .translator import DecodeStats

    _check_translate_flags(args)
    if args.plot_attention:
        figure_format(args.plot_attention, "--plot-attention")  # a bad path fails now, not after the translation
    translator = _load(args)
    drawn = None                   # (the sentence, its Translation) --plot-attention draws
    unsure = _Unsure(translator, stream=not (args.input is not None or _is_regular_file(sys.stdin)))
    bad: list[int] = []            # numbers of the input lines that were not UTF-8 (--skip-bad-lines)
    if args.input is not None or _is_regular_file(sys.stdin):
        if args.input is not None:
            raw, source = read_bytes(args.input, "--input"), args.input
            if not raw:
                raise UserError(f"{args.input}: the file is empty (expected one sentence per line)")
        else:
            raw, source = _stdin_bytes(sys.stdin), "standard input"
        lines, bad = decode_lines(raw, source, skip_bad=args.skip_bad_lines)
        rendered, results = _render(translator, args, lines, 0, progress=True, attention=bool(args.plot_attention))
        for line in rendered:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        stats = translator.last_stats
        drawn = next(((ln, t) for ln, t in zip(lines, results) if t.attention is not None), None)
        unsure.check(lines, results, 1)
    else:
        # A terminal or a pipe: whoever writes the lines may wait for each answer before sending the next.
        stats = DecodeStats()
        for i, line in enumerate(_stream_lines(sys.stdin, args.skip_bad_lines, bad)):
            # One line: no bar; the map only until the first one is kept.
            rendered, (result,) = _render(translator, args, [line], i, progress=False,
                                          attention=bool(args.plot_attention) and drawn is None)
            for out in rendered:
                sys.stdout.write(out + "\n")
            sys.stdout.flush()
            stats.add(translator.last_stats)
            if drawn is None and result.attention is not None:
                drawn = (line, result)
            unsure.check([line], [result], i + 1)
    print(_speed_line(stats, args), file=sys.stderr)
    unsure.summary()
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
        print(f"fastqa: skipped {len(bad)} line{'s' if len(bad) > 1 else ''} that {'were' if len(bad) > 1 else 'was'} "
              f"not UTF-8 text (line {shown}): each answered with an empty line", file=sys.stderr)
    if args.plot_attention:
        if drawn is None:
            raise UserError("--plot-attention: every input line is empty")
        # The map of the search that produced the printed translation: no second decoding.
        plot_attention_map(drawn[1].attention, args.plot_attention)
        print(f"attention map of {drawn[0]!r} -> {args.plot_attention}", file=sys.stderr)
    return 0


def _is_regular_file(stream: TextIO) -> bool:
    """Whether ``stream`` reads a regular file (``< file``): all its lines are there at once, so they are
    batched; a terminal, a pipe or a stream without a descriptor is read line by line."""
    import stat

    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return False


def _stream_lines(stream: TextIO, skip_bad: bool, bad: list[int]) -> Iterator[str]:
    """The lines of ``stream`` one at a time, as they arrive, without their endings (a last line without a
    newline counts), each decoded as UTF-8 on its own (``decode_lines``: a line that is not is an error naming
    it, or with ``skip_bad`` an empty line whose number goes into ``bad``). readline returns as soon as a line
    is complete; it never waits to fill a buffer."""
    from ...data.files import decode_lines

    binary = getattr(stream, "buffer", None)   # a text stream without bytes below it (a StringIO) is text already
    number = 0
    while True:
        raw = binary.readline() if binary is not None else stream.readline().encode("utf-8", "surrogateescape")
        if not raw:
            return
        number += 1
        lines, skipped = decode_lines(raw, "standard input", skip_bad=skip_bad, first=number)
        bad.extend(skipped)
        yield lines[0] if lines else ""


def _stdin_bytes(stream: TextIO) -> bytes:
    """All of ``stream``'s bytes (its text re-encoded where it has no bytes below it)."""
    binary = getattr(stream, "buffer", None)
    return binary.read() if binary is not None else stream.read().encode("utf-8", "surrogateescape")


def _fit_confidence(args: argparse.Namespace, translations: list) -> None:
    """Write the model folder's ``confidence.json`` (``ConfidenceFloor``) from the translations of --src's
    sentences (their per-token log-probabilities and entropies)."""
    from pathlib import Path

    from ...data.files import atomic_write_json
    from ...errors import UserError
    from ...export import META_FILES
    from .translator import ConfidenceFloor

    folder = Path(args.model) if args.model is not None else None
    if folder is None or not folder.is_dir():
        raise UserError(f"--fit-confidence writes into the model's folder: --model {args.model} is not one")
    floor = ConfidenceFloor.fit([t.token_log_prob for t in translations], quantile=args.fit_confidence,
                                fitted_on=Path(args.src).name, beam=args.beam,
                                entropies=[t.entropy for t in translations])
    atomic_write_json(folder / META_FILES["confidence"], floor.to_dict())
    print(f"fastqa: confidence floor: log-probability per token {floor.score:.3f} (the {floor.quantile:g} quantile "
          f"of {len(translations)} sentences), next-token entropy {floor.entropy:.3f} (the {1 - floor.quantile:g} "
          f"quantile), beam {floor.beam}; written to {folder / META_FILES['confidence']}", file=sys.stderr)


def run_eval(args: argparse.Namespace) -> int:
    from ...data.files import atomic_write_json, atomic_write_text
    from ...errors import UserError
    from .bleu import corpus_scores, format_tokenized_bleu, text_tokenized_bleu, tokenized_bleu
    from .parallel import guess_lang, read_lines, read_parallel, tokenize_line

    if args.hyp is not None:
        given = [flag for flag, value in (("--model", args.model), ("--src", args.src), ("--output", args.output),
                                          ("--fit-confidence", args.fit_confidence)) if value is not None]
        if given:
            raise UserError(f"--hyp scores an existing translation file: leave out {' and '.join(given)}")
        hyps, refs = read_lines(args.hyp), read_lines(args.ref)
        if len(hyps) != len(refs):
            raise UserError(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}: "
                            f"scoring needs one translation per reference line")
        lang = args.tgt_lang or guess_lang(args.ref, "--tgt-lang", required=False) or "xx"
        tok = text_tokenized_bleu(hyps, refs, lang)
        stats = None
    else:
        if args.src is None:
            raise UserError("mt-eval needs --src (or --hyp FILE to score a translation file)")
        translator = _load(args)
        src, refs = read_parallel(args.src, args.ref)
        translations = translator.translate(src, **_decode_kwargs(args),
                                            entropy=True if args.fit_confidence is not None else None)
        stats = translator.last_stats
        hyp_tokens, hyps = [t.tokens for t in translations], [t.text for t in translations]
        if args.fit_confidence is not None:
            _fit_confidence(args, [t for s, t in zip(src, translations) if translator.source_tokens(s)])
        lang = args.tgt_lang or translator.codec.bleu_lang
        if translator.vocab_kind == "word":
            # The tutorial's figure: the model's own (lowercased) words against lowercased reference tokens.
            tok = tokenized_bleu(hyp_tokens, [tokenize_line(r, lang, lowercase=True) for r in refs])
        else:
            tok = text_tokenized_bleu(hyps, refs, lang)
        if translator.lowercase and not args.lowercase:
            print("fastqa: note: the model writes lowercased text, which cannot match the references' capitals; "
                  "--lowercase gives the case-insensitive scores", file=sys.stderr)
    scores = corpus_scores(hyps, refs, lowercase=args.lowercase)
    print(scores.bleu.line)
    print(scores.chrf.line)
    print(format_tokenized_bleu(tok))
    if stats is not None:
        print(_speed_line(stats, args), file=sys.stderr)
    if args.output:
        atomic_write_text(args.output, "".join(h + "\n" for h in hyps))
    if args.json:
        report = {"model": args.model, "src": args.src, "hyp": args.hyp, "ref": args.ref, **scores.to_dict(),
                  # the names of the first reports, kept for their readers
                  "sacrebleu": scores.bleu.score, "sacrebleu_line": scores.bleu.line,
                  "tokenized_bleu": tok.score, "tokenized_precisions": list(tok.precisions), "tokenized_bp": tok.bp,
                  "tokenized_lang": lang}
        if stats is not None:
            s = max(stats.seconds, 1e-9)
            report.update({"vocab": translator.vocab_kind, "beam": args.beam, "incremental": not args.no_incremental,
                           "len_penalty": args.len_penalty, "output_tokens": stats.tokens,
                           "decode_seconds": stats.seconds, "sentences_per_s": stats.sentences / s,
                           "tokens_per_s": stats.tokens / s})
        atomic_write_json(args.json, report)
    return 0
