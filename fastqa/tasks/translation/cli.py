"""Translation subcommands: ``mt-train``, ``translate``, ``mt-eval``.

Heavy imports (torch models, spaCy, sacrebleu) happen inside the ``run_*`` functions so ``fastqa --help``
stays quick.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from ..flags import (
    add_runtime_flags,
    add_training_flags,
    amp_of,
    check_training_flags,
    positive_float,
    positive_int,
    resolve_device,
    threads,
)

LAYERS = ("fast", "reference")

__all__ = ["register"]


def _decoding_args(p: argparse.ArgumentParser, default_beam: int) -> None:
    p.add_argument("--model", required=True, metavar="DIR", help="run folder of mt-train (its checkpoint.pt)")
    p.add_argument("--beam", type=positive_int, default=default_beam,
                   help=f"beam size; 1 decodes greedily (default {default_beam})")
    p.add_argument("--no-incremental", action="store_true",
                   help="re-run the decoder over the whole prefix at every step (slow; for comparison)")
    p.add_argument("--len-penalty", type=float, default=1.0, help="beam score = log-prob / length**this")
    p.add_argument("--max-len-a", type=float, default=1.2, help="max output length = a * source length + b")
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--batch-size", type=positive_int, default=64, help="sentences decoded together")
    p.add_argument("--layers", choices=LAYERS, default=None,
                   help="fastqa's fused layers (fast, default) or the pure-PyTorch reference layers (same weights)")
    add_runtime_flags(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("mt-train", help="train a ConvS2S translation model on parallel text",
                              description="Train a ConvS2S model (Gehring et al. 2017) on parallel text, one "
                              "sentence per line (plain or .gz). Works under torchrun (DDP).")
    p.add_argument("--src", required=True, help="training source sentences")
    p.add_argument("--tgt", required=True, help="training target sentences (same line count)")
    p.add_argument("--valid-src", required=True)
    p.add_argument("--valid-tgt", required=True)
    p.add_argument("--src-lang", help="spaCy language of the source (default: from the file name, train.de.gz -> de)")
    p.add_argument("--tgt-lang", help="spaCy language of the target (default: from the file name)")
    p.add_argument("--no-lowercase", action="store_true", help="keep case (default: lowercase, as the tutorial)")
    p.add_argument("--min-freq", type=positive_int, default=2, help="vocabulary: tokens seen at least this often")
    p.add_argument("--preset", choices=("small", "tutorial"), default="small")
    p.add_argument("--max-len", type=positive_int, help="drop training pairs longer than this (tokens + <eos>)")
    p.add_argument("--optimizer", choices=("adam", "nag"), default="adam",
                   help="adam (the tutorial) or nag: SGD with Nesterov momentum 0.99 (fairseq fconv)")
    p.add_argument("--lr", type=positive_float, help="learning rate (default: adam 1e-3, nag 0.25)")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--valid-bleu", type=int, default=0, metavar="N",
                   help="also greedy tokenized BLEU on the first N validation pairs at each evaluation")
    add_training_flags(p, clip=0.1, eval_every=0, batch_size=64, layers=LAYERS,
                       eval_every_help="steps between evaluations (default 0: at the end of each epoch)")
    p.set_defaults(func=run_train)

    p = subparsers.add_parser("translate", help="translate sentences (stdin or --input) with a trained model",
                              description="Read one sentence per line, write one translation per line "
                              "(empty lines stay empty).")
    _decoding_args(p, default_beam=5)
    p.add_argument("--input", metavar="F", help="sentences to translate (default: stdin)")
    p.add_argument("--tokenized", action="store_true",
                   help="write the model's tokens separated by spaces instead of detokenized text")
    p.add_argument("--plot-attention", metavar="OUT.png",
                   help="draw the source x target attention map of the first non-empty sentence")
    p.set_defaults(func=run_translate)

    p = subparsers.add_parser("mt-eval", help="BLEU of a trained model on a test set",
                              description="Translate --src and score against --ref: sacrebleu's corpus BLEU "
                              "on detokenized output, and the tutorial's tokenized lowercased BLEU.")
    _decoding_args(p, default_beam=5)
    p.add_argument("--src", required=True, help="source sentences")
    p.add_argument("--ref", required=True, help="reference translations (same line count)")
    p.add_argument("--output", metavar="F", help="also write the translations (detokenized) here")
    p.add_argument("--json", metavar="F", help="also write the scores and decoding speed as JSON here")
    p.set_defaults(func=run_eval)


def run_train(args: argparse.Namespace) -> int:
    with threads(args.threads):
        return _run_train(args)


def _run_train(args: argparse.Namespace) -> int:
    from ...errors import UserError
    from ...train.loop import TrainSettings
    from .task import MTOptions, train_translation

    check_training_flags(args)
    device = resolve_device(args.device)
    overrides = dict(args.overrides)
    for key in ("src_vocab_size", "tgt_vocab_size"):
        if key in overrides:
            raise UserError(f"--set {key}=...: the vocabulary sizes are set from the data")
    opts = MTOptions(src=args.src, tgt=args.tgt, valid_src=args.valid_src, valid_tgt=args.valid_tgt,
                     src_lang=args.src_lang, tgt_lang=args.tgt_lang, lowercase=not args.no_lowercase,
                     min_freq=args.min_freq, preset=args.preset, config_overrides=overrides, layers=args.layers or "fast",
                     max_len=args.max_len, batch_size=args.batch_size, optimizer=args.optimizer, lr=args.lr,
                     label_smoothing=args.label_smoothing, valid_bleu=args.valid_bleu, seed=args.seed)
    epochs = args.epochs
    settings = TrainSettings(out_dir=args.out, max_steps=args.max_steps, epochs=epochs,
                             clip_norm=args.clip or None, eval_every=args.eval_every, log_every=args.log_every,
                             seed=args.seed, amp=amp_of(args.precision, device), resume=args.resume,
                             progress=not args.no_progress, max_minutes=args.max_minutes, device=device)
    metrics = train_translation(opts, settings)
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 reports
        print(json.dumps(metrics))
    return 0


def _load(args: argparse.Namespace):
    from .translator import Translator

    return Translator.load(args.model, layers=args.layers or "fast", device=resolve_device(args.device))


def _decode_kwargs(args: argparse.Namespace) -> dict:
    return dict(beam=args.beam, incremental=not args.no_incremental, len_penalty=args.len_penalty,
                max_len_a=args.max_len_a, max_len_b=args.max_len_b, batch_size=args.batch_size)


def _speed_line(stats, args: argparse.Namespace) -> str:
    s = max(stats.seconds, 1e-9)
    mode = "greedy" if args.beam == 1 else f"beam {args.beam}"
    how = "full recompute" if args.no_incremental else "incremental"
    return (f"decoded {stats.sentences} sentences ({stats.tokens} tokens) in {stats.seconds:.2f} s, {mode}, "
            f"{how}: {stats.sentences / s:.1f} sentences/s, {stats.tokens / s:.1f} tokens/s")


def run_translate(args: argparse.Namespace) -> int:
    with threads(args.threads):
        return _run_translate(args)


def _run_translate(args: argparse.Namespace) -> int:
    from .parallel import read_lines
    from .translator import plot_format

    if args.plot_attention:
        plot_format(args.plot_attention)  # a bad path fails now, not after the translation
    translator = _load(args)
    if args.input is not None:
        lines = read_lines(args.input)
    else:
        lines = _read_stdin(sys.stdin)
    kwargs = _decode_kwargs(args)
    if args.tokenized:
        outputs = [" ".join(t) for t in translator.translate_tokens(lines, **kwargs)]
    else:
        outputs = translator.translate(lines, **kwargs)
    for line in outputs:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    print(_speed_line(translator.last_stats, args), file=sys.stderr)
    if args.plot_attention:
        first = next((ln for ln in lines if translator.source_tokens(ln)), None)
        if first is None:
            from ...errors import UserError

            raise UserError("--plot-attention: every input line is empty")
        translator.plot_attention(first, args.plot_attention, **kwargs)
        print(f"attention map of {first!r} -> {args.plot_attention}", file=sys.stderr)
    return 0


def _read_stdin(stream: TextIO) -> list[str]:
    """Lines of ``stream`` without their endings (a last line without a newline counts)."""
    lines = stream.read().split("\n")
    if lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def run_eval(args: argparse.Namespace) -> int:
    with threads(args.threads):
        return _run_eval(args)


def _run_eval(args: argparse.Namespace) -> int:
    from ...data.files import atomic_write_json, atomic_write_text
    from ...data.tokenize import detokenize
    from .bleu import corpus_bleu, tokenized_bleu
    from .parallel import read_parallel, tokenize_line

    translator = _load(args)
    src, refs = read_parallel(args.src, args.ref)
    hyp_tokens = translator.translate_tokens(src, **_decode_kwargs(args))
    stats = translator.last_stats
    hyps = [detokenize(t, translator.tgt_lang) for t in hyp_tokens]
    # A lowercased model cannot produce the references' capitals: score it case-insensitively (case:lc).
    sacre = corpus_bleu(hyps, refs, lowercase=translator.lowercase)
    ref_tokens = [tokenize_line(r, translator.tgt_lang, lowercase=True) for r in refs]
    tok = tokenized_bleu(hyp_tokens, ref_tokens, lowercase=True)
    print(sacre.line)
    print(f"tokenized BLEU (lowercased spaCy tokens, torchtext bleu_score as the tutorial) = {tok.score:.2f} "
          f"{'/'.join(f'{p:.1f}' for p in tok.precisions)} (BP = {tok.bp:.3f} hyp_len = {tok.sys_len} "
          f"ref_len = {tok.ref_len})")
    print(_speed_line(stats, args), file=sys.stderr)
    if args.output:
        atomic_write_text(args.output, "".join(h + "\n" for h in hyps))
    if args.json:
        s = max(stats.seconds, 1e-9)
        atomic_write_json(args.json, {
            "model": args.model, "src": args.src, "ref": args.ref, "beam": args.beam,
            "incremental": not args.no_incremental, "len_penalty": args.len_penalty,
            "sacrebleu": sacre.score, "sacrebleu_line": sacre.line, "tokenized_bleu": tok.score,
            "tokenized_precisions": list(tok.precisions), "tokenized_bp": tok.bp,
            "sentences": stats.sentences, "output_tokens": stats.tokens, "decode_seconds": stats.seconds,
            "sentences_per_s": stats.sentences / s, "tokens_per_s": stats.tokens / s})
    return 0
