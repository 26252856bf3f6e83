"""Translation subcommands: ``mt-train``, ``translate``, ``mt-eval``.

Heavy imports (torch models, spaCy, sacrebleu) happen inside the ``run_*`` functions so ``fastqa --help``
stays quick.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Iterator, TextIO

from ._args import field_value, positive_int

__all__ = ["register"]


def _config_item(text: str) -> tuple[str, object]:
    """"FIELD=VALUE" -> (field, value); the value is read as JSON (numbers, true/false), else kept a str."""
    key, value = field_value(text)
    if key in ("src_vocab_size", "tgt_vocab_size", "layers"):
        raise argparse.ArgumentTypeError(f"{key} is set from the data / --layers, not --config")
    return key, value


def _threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=positive_int,
                   help="CPU threads for torch (default: torch's; on a busy machine 1 can be much faster)")


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to n for the command, then put back (callers in-process keep theirs)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
    p.add_argument("--layers", choices=("fast", "reference"), default="fast",
                   help="fastqa's fused layers or the pure-PyTorch reference layers (same weights)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    _threads_arg(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("mt-train", help="train a ConvS2S translation model on parallel text",
                              description="Train a ConvS2S model (Gehring et al. 2017) on parallel text, one "
                              "sentence per line (plain or .gz). Works under torchrun (DDP).")
    p.add_argument("--src", required=True, help="training source sentences")
    p.add_argument("--tgt", required=True, help="training target sentences (same line count)")
    p.add_argument("--valid-src", required=True)
    p.add_argument("--valid-tgt", required=True)
    p.add_argument("--out", required=True, metavar="DIR", help="run folder: checkpoint.pt, metrics.jsonl, curve.png")
    p.add_argument("--src-lang", help="spaCy language of the source (default: from the file name, train.de.gz -> de)")
    p.add_argument("--tgt-lang", help="spaCy language of the target (default: from the file name)")
    p.add_argument("--no-lowercase", action="store_true", help="keep case (default: lowercase, as the tutorial)")
    p.add_argument("--min-freq", type=positive_int, default=2, help="vocabulary: tokens seen at least this often")
    p.add_argument("--preset", choices=("small", "tutorial"), default="small")
    p.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE", type=_config_item,
                   help="override a ConvS2SConfig field of the preset (repeatable), e.g. --config dropout=0.1 "
                   "--config encoder_layers=4")
    p.add_argument("--layers", choices=("fast", "reference"), default="fast")
    p.add_argument("--max-len", type=positive_int, help="drop training pairs longer than this (tokens + <eos>)")
    p.add_argument("--batch-size", type=positive_int, default=64, help="sentence pairs per step (all ranks)")
    p.add_argument("--optimizer", choices=("adam", "nag"), default="adam",
                   help="adam (the tutorial) or nag: SGD with Nesterov momentum 0.99 (fairseq fconv)")
    p.add_argument("--lr", type=float, help="learning rate (default: adam 1e-3, nag 0.25)")
    p.add_argument("--clip-norm", type=float, default=0.1, help="max gradient norm (default 0.1, as the tutorial)")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--epochs", type=positive_int)
    p.add_argument("--max-steps", type=positive_int)
    p.add_argument("--max-minutes", type=float, help="wall-clock budget: then evaluate, checkpoint and stop "
                   "(alone: train until it is spent; with --epochs/--max-steps: whichever comes first)")
    p.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (default: each epoch)")
    p.add_argument("--log-every", type=positive_int, default=50)
    p.add_argument("--valid-bleu", type=int, default=0, metavar="N",
                   help="also greedy tokenized BLEU on the first N validation pairs at each evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--device", help="torch device (default: this rank's GPU if any, else cpu)")
    _threads_arg(p)
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
    with _threads(args.threads):
        return _run_train(args)


def _run_train(args: argparse.Namespace) -> int:
    from ..pipelines.translation import MTOptions, train_translation
    from ..train.loop import TrainSettings

    overrides = dict(args.config)
    opts = MTOptions(src=args.src, tgt=args.tgt, valid_src=args.valid_src, valid_tgt=args.valid_tgt,
                     src_lang=args.src_lang, tgt_lang=args.tgt_lang, lowercase=not args.no_lowercase,
                     min_freq=args.min_freq, preset=args.preset, config_overrides=overrides, layers=args.layers,
                     max_len=args.max_len, batch_size=args.batch_size, optimizer=args.optimizer, lr=args.lr,
                     label_smoothing=args.label_smoothing, valid_bleu=args.valid_bleu, seed=args.seed)
    epochs = args.epochs
    settings = TrainSettings(out_dir=args.out, max_steps=args.max_steps, epochs=epochs,
                             clip_norm=args.clip_norm, eval_every=args.eval_every, log_every=args.log_every,
                             seed=args.seed, resume=args.resume, progress=not args.no_progress,
                             max_minutes=args.max_minutes, device=args.device)
    metrics = train_translation(opts, settings)
    if os.environ.get("RANK", "0") == "0":  # under torchrun only rank 0 reports
        print(json.dumps(metrics))
    return 0


def _load(args: argparse.Namespace):
    from ..pipelines.translation import Translator

    return Translator.load(args.model, layers=args.layers, device=args.device)


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
    with _threads(args.threads):
        return _run_translate(args)


def _run_translate(args: argparse.Namespace) -> int:
    from ..data.translation import read_lines
    from ..pipelines.translation import plot_format

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
            from ..errors import UserError

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
    with _threads(args.threads):
        return _run_eval(args)


def _run_eval(args: argparse.Namespace) -> int:
    from ..data.translation import read_parallel, tokenize_line
    from ..metrics.bleu import corpus_bleu, detokenize, tokenized_bleu
    from ..train.checkpoint import atomic_write_json, atomic_write_text

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
