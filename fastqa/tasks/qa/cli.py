"""``fastqa qa-train | qa-predict | qa-eval | ask``: readers on SQuAD from the shell.

    fastqa qa-train --train train.json --dev dev.json [--vectors glove.txt.gz] --out runs/qanet
    fastqa qa-train --model lstm-pointer ...                    (or lstm, lstm-attention: the recurrent baselines)
    torchrun --nproc_per_node 2 -m fastqa.cli qa-train ...      (DistributedDataParallel, same flags)
    fastqa qa-predict --model runs/qanet --data dev.json --out pred.json [--na-prob-out na.json]
    fastqa qa-eval dev.json pred.json [--na-prob na.json]       (the official evaluation JSON on stdout)
    fastqa qa-calibrate --model runs/qanet --data dev.json --articles 36:40   (scores that are probabilities)
    fastqa qa-eval dev.json pred.json --scores scores.json --calibration reliability.png
    fastqa ask --context "..." --question "..." [--top-k 3] [--plot probs.png|.pdf|.svg|...]
    fastqa ask --model runs/qanet --input questions.jsonl [--output answers.jsonl] [--batch-size 32]

``--model`` takes a run folder, a slim export (``fastqa export``) or a shipped model's name; ``ask`` without
it uses the shipped reader. Contexts longer than ``--max-context`` tokens are read in windows that overlap by
``--stride`` tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..flags import (add_commands, add_runtime_flags, add_skip_bad_lines_flag, add_training_flags, amp_of,
                     cuda_graphs_of,
                     check_training_flags, counted, positive_float, probability, resolve_device)
from .readers import MODELS

LAYERS = ("fast", "reference", "naive")

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    add_commands(subparsers, (
        ("qa-train", _qa_train_flags, run_train,
         "train a reader (QANet or a baseline) on SQuAD (also under torchrun)"),
        ("qa-predict", _qa_predict_flags, run_predict, "answer every question of a SQuAD file"),
        ("qa-calibrate", _qa_calibrate_flags, run_calibrate,
         "fit the reader's answer scores to the probability of being right"),
        ("qa-eval", _qa_eval_flags, run_eval, "official SQuAD v1.1/v2.0 EM/F1 of a predictions file"),
        ("ask", _ask_flags, run_ask, "answer a question about a context (or a JSON-lines file of them)"),
    ))


def _qa_train_flags(p: argparse.ArgumentParser) -> None:
    """Train a reader on a SQuAD v1.1/v2.0 file, evaluating on another with the official EM/F1. Writes
    OUT/checkpoint.pt, OUT/metrics.jsonl and OUT/curve.png."""
    p.add_argument("--model", choices=MODELS, default="qanet",
                   help="the reader: qanet (default) or the recurrent baselines lstm, lstm-attention, lstm-pointer")
    p.add_argument("--train", required=True, metavar="F", help="SQuAD JSON (.json or .json.gz) to train on")
    p.add_argument("--dev", required=True, metavar="F", help="SQuAD JSON to evaluate on")
    p.add_argument("--vectors", metavar="F", help="GloVe/fastText text vectors (.txt/.gz); without: random vectors")
    p.add_argument("--preset", default="small", metavar="NAME",
                   help="model size (default small; QANet: small, paper; the baselines: small, base)")
    p.add_argument("--single-word-answers", action="store_true",
                   help="train only on questions whose answer is one token (as the attention tutorial)")
    p.add_argument("--train-articles", metavar="A:B", help="use only these articles of --train, e.g. 0:40")
    p.add_argument("--dev-articles", metavar="A:B", help="use only these articles of --dev, e.g. 40:48")
    p.add_argument("--no-answer", choices=("auto", "yes", "no"), default="auto",
                   help="SQuAD v2.0 no-answer option (auto: when the training file is v2.0)")
    p.add_argument("--eval-batch-size", type=counted("batch_size"), default=32)
    p.add_argument("--eval-each-epoch", action="store_true", help="also evaluate at the end of every epoch")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--warmup", type=counted("warmup"), default=1000, metavar="N", help="log warm-up steps (default 1000)")
    p.add_argument("--ema", type=float, default=0.9999, help="EMA decay of the weights for evaluation (0: off)")
    add_training_flags(p, clip=5.0, eval_every=1000, batch_size=32, layers=LAYERS,
                       eval_every_help="steps between evaluations (default 1000; 0: at the end)")
    _cache_flags(p)


def _qa_predict_flags(p: argparse.ArgumentParser) -> None:
    """Predictions JSON {question id: answer} in the official format."""
    p.add_argument("--model", required=True, metavar="DIR",
                   help="a qa-train run folder (or its checkpoint.pt), an export, or a shipped model's name")
    p.add_argument("--data", required=True, metavar="F", help="SQuAD JSON (.json or .json.gz)")
    p.add_argument("--out", required=True, metavar="PRED.json")
    p.add_argument("--na-prob-out", metavar="F", help="also write {question id: no-answer probability} (v2.0 models)")
    p.add_argument("--scores-out", metavar="F", help="also write {question id: the answer's score} (the probability "
                   "that it is right when the model is calibrated: qa-calibrate)")
    _predict_flags(p)


def _qa_calibrate_flags(p: argparse.ArgumentParser) -> None:
    """Answers every question of --data (articles the model was NOT trained on), fits a Platt scaling of the
    answers' scores to their exact match, and writes it to MODEL/calibration.json (or --out): from then on the
    model's scores estimate the probability that an answer is right, and an export carries it. Prints the fit and
    the expected calibration error before and after, on those questions."""
    p.add_argument("--model", required=True, metavar="DIR", help="a qa-train run folder or an export")
    p.add_argument("--data", required=True, metavar="F", help="SQuAD JSON (.json or .json.gz) held out from training")
    p.add_argument("--out", metavar="F", help="where to write the calibration (default: MODEL/calibration.json)")
    p.add_argument("--plot", metavar="OUT.png", help="also draw the reliability diagram after the fit")
    _predict_flags(p)


def _qa_eval_flags(p: argparse.ArgumentParser) -> None:
    """Prints the official evaluation JSON (v1.1: exact_match, f1; v2.0: exact, f1, total, HasAns_*, NoAns_*,
    best_* with --na-prob)."""
    p.add_argument("data", metavar="DATA.json", help="SQuAD JSON (.json or .json.gz)")
    p.add_argument("predictions", metavar="PRED.json", help="{question id: answer text}")
    p.add_argument("--na-prob", metavar="F", help="{question id: no-answer probability} (v2.0)")
    p.add_argument("--na-prob-thresh", type=float, default=1.0,
                   help="v2.0: answer '' when the no-answer probability exceeds this (default 1.0, as official)")
    p.add_argument("--articles", metavar="A:B", help="score only these articles of DATA, e.g. 40:48")
    p.add_argument("--version", choices=("1.1", "2.0"), help="scoring semantics (default: the data file's version)")
    p.add_argument("--strict", action="store_true",
                   help="refuse predictions that miss a question of DATA or answer an id DATA does not have "
                   "(default: a warning with the counts; a missing one scores 0 in v1.1 and is always an "
                   "error in v2.0)")
    p.add_argument("--scores", metavar="F", help="{question id: answer score} (qa-predict --scores-out): adds the "
                   "expected calibration error of the scores (ece, over 10 bins) to the result")
    p.add_argument("--calibration", metavar="PLOT", help="with --scores: draw the reliability diagram here (.png, .pdf, "
                   ".svg, ...)")


def _ask_flags(p: argparse.ArgumentParser) -> None:
    """Prints {"answer": {text, start, end, score, no_answer_prob, abstained}, "answers": [the --top-k best, best
    first]}: text is context[start:end]; score the probability that the answer is right (a calibrated reader, as
    the shipped one is). With --input, one such JSON line per question of a JSON-lines file, with its id. One
    question runs on one CPU thread unless --threads says otherwise (a file of them on torch's default)."""
    p.add_argument("--model", default=None, metavar="DIR",
                   help="a run folder, an export or a shipped model's name (default: the shipped reader, "
                   "qanet-small-squad)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--context", metavar="TEXT")
    src.add_argument("--context-file", metavar="F", help="UTF-8 text file holding the context")
    src.add_argument("--input", metavar="F.jsonl",
                     help='JSON lines, one {"id", "context", "question"} per line ("id" optional: the line number)')
    p.add_argument("--question", metavar="TEXT", help="the question (with --context or --context-file)")
    add_skip_bad_lines_flag(p, what="with --input: answer the lines that hold a question and skip the others")
    p.add_argument("--output", metavar="F", help="write the JSON (lines) here instead of stdout")
    p.add_argument("--top-k", type=counted("top_k"), metavar="K", help="the K best distinct answers, best first")
    p.add_argument("--min-score", type=probability, metavar="P",
                   help="no answer below this score (\"no confident answer\"; the text is empty and \"abstained\" is "
                   "true); a calibrated model's score is the probability that the answer is right")
    p.add_argument("--batch-size", type=counted("batch_size"), default=32, metavar="N",
                   help="windows per batch (default 32)")
    p.add_argument("--plot", metavar="OUT.png",
                   help="draw the start/end probabilities around the answer (.png, .pdf, .svg, .eps...)")
    p.add_argument("--layers", choices=LAYERS, default=None)
    p.add_argument("--max-answer-len", type=counted("max_answer_len"), metavar="N",
                   help="longest answer, in tokens - 1 (default 30; 0: one-token answers; "
                   "a value past the context's length allows any span of it)")
    _window_flags(p)
    add_runtime_flags(p)


def _predict_flags(p: argparse.ArgumentParser) -> None:
    """The flags of answering a SQuAD file (qa-predict, qa-calibrate)."""
    p.add_argument("--articles", metavar="A:B", help="only these articles of --data, e.g. 40:48")
    p.add_argument("--layers", choices=LAYERS, default=None)
    p.add_argument("--batch-size", type=counted("batch_size"), default=32)
    _window_flags(p)
    add_runtime_flags(p)
    _cache_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _window_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-context", type=counted("max_context"), metavar="N",
                   help="context tokens the reader sees at once; a longer context is read in overlapping windows "
                   "(default: the context length the model was trained on, 400 for the shipped reader)")
    p.add_argument("--stride", type=counted("stride"), metavar="S",
                   help="tokens of overlap between consecutive windows (default 128, at most half a window)")


def _cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", metavar="DIR",
                   help="preprocessed-data cache (default $FASTQA_CACHE_DIR or ~/.cache/fastqa)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the preprocessed-data cache")


def _cache_dir(args):
    from ...data.files import user_cache_dir

    if args.no_cache:
        return None
    return args.cache_dir or user_cache_dir()


def run_train(args) -> int:
    from ...errors import UserError
    from ...train.loop import TrainSettings, fit
    from .squad import Limits
    from .task import QATask, Recipe

    check_training_flags(args)
    device = resolve_device(args.device)
    amp = amp_of(args.precision, device)
    graphs = cuda_graphs_of(args.cuda_graphs, device)
    if not 0.0 <= args.ema < 1.0:
        raise UserError(f"--ema must be in [0, 1), got {args.ema}")
    for flag, path in (("--train", args.train), ("--dev", args.dev), ("--vectors", args.vectors)):
        if path is not None and not os.path.isfile(path):
            raise UserError(f"{path}: no such file ({flag})")
    rank0 = int(os.environ.get("RANK", "0")) == 0  # under torchrun only rank 0 reports
    if not rank0:
        import logging

        logging.getLogger("fastqa").setLevel(logging.WARNING)
    recipe = Recipe(lr=args.lr, warmup_steps=args.warmup, batch_size=args.batch_size,
                    eval_batch_size=args.eval_batch_size, seed=args.seed)
    no_answer = {"auto": None, "yes": True, "no": False}[args.no_answer]
    limits = Limits(answer=0) if args.single_word_answers else Limits()
    task = QATask.from_files(args.train, args.dev, model=args.model, vectors=args.vectors, preset=args.preset,
                             layers=args.layers, train_articles=args.train_articles, dev_articles=args.dev_articles,
                             no_answer=no_answer, overrides=dict(args.overrides), recipe=recipe, limits=limits,
                             cache_dir=_cache_dir(args), progress=rank0 and not args.no_progress)
    settings = TrainSettings(out_dir=args.out, max_steps=args.max_steps, epochs=args.epochs,
                             clip_norm=args.clip or None, ema_decay=args.ema or None, eval_every=args.eval_every,
                             eval_each_epoch=args.eval_each_epoch,
                             log_every=args.log_every, seed=args.seed, amp=amp, resume=args.resume,
                             progress=not args.no_progress, max_minutes=args.max_minutes, save_every_minutes=args.save_every_minutes or None, device=device,
                             cuda_graphs=graphs)
    n_params = sum(p.numel() for p in task.model.parameters() if p.requires_grad)
    if rank0:
        print(f"qa-train: {task.kind}, {len(task.train_data)} training questions, {len(task.dev_data)} dev questions, "
              f"{len(task.words)} words, {len(task.chars)} chars, {n_params} trainable parameters"
              + (f", layers {task.config.layers}" if task.kind == "qanet" else ""), file=sys.stderr)
    metrics = fit(task, settings)
    if rank0:
        print(json.dumps(metrics))
    return 0


def run_predict(args) -> int:
    from ...data.files import atomic_write_json
    from ...errors import UserError

    qa = _load_reader(args)
    if args.na_prob_out and not qa.config.no_answer:
        raise UserError(f"--na-prob-out: the model in {args.model} has no no-answer option (trained on SQuAD v1.1)")
    qa.windows(args.max_context, args.stride)  # a bad --stride is reported before the data is read
    _, out = qa.predict_file(args.data, articles=args.articles, batch_size=args.batch_size,
                             cache_dir=_cache_dir(args), progress=not args.no_progress,
                             max_context=args.max_context, stride=args.stride)
    atomic_write_json(args.out, out.predictions)
    if args.na_prob_out:
        atomic_write_json(args.na_prob_out, out.na_probs)
    if args.scores_out:
        atomic_write_json(args.scores_out, out.scores)
    print(f"qa-predict: {len(out.predictions)} answers written to {args.out}"
          + (f", no-answer probabilities to {args.na_prob_out}" if args.na_prob_out else "")
          + (f", scores to {args.scores_out}" if args.scores_out else ""), file=sys.stderr)
    return 0


def run_calibrate(args) -> int:
    from pathlib import Path

    from ...data.files import atomic_write_json
    from ...errors import UserError
    from ...plots import expected_calibration_error, figure_format, plot_reliability
    from .calibration import CALIBRATION_NAME, fit_platt
    from .metric import exact_matches

    model = Path(args.model)
    if args.out is None and not model.is_dir():
        raise UserError(f"--model {args.model}: not a folder; give a run folder or an export, or --out F")
    out = Path(args.out) if args.out else model / CALIBRATION_NAME
    if args.plot:
        figure_format(args.plot, "--plot")  # before minutes of reading
    qa = _load_reader(args)
    qa.calibration = None  # fitted on the raw scores, whatever the folder held before
    qa.windows(args.max_context, args.stride)
    data, pred = qa.predict_file(args.data, articles=args.articles, batch_size=args.batch_size,
                                 cache_dir=_cache_dir(args), progress=not args.no_progress,
                                 max_context=args.max_context, stride=args.stride)
    right = exact_matches(data.dataset, pred.predictions)
    qids = sorted(right)
    raw = [pred.scores[q] for q in qids]
    hits = [right[q] for q in qids]
    where = Path(args.data).name + (f" articles {args.articles}" if args.articles else "")
    cal = fit_platt(raw, hits, fitted_on=where)
    calibrated = [cal(s) for s in raw]
    atomic_write_json(out, cal.to_dict())
    if args.plot:
        plot_reliability(calibrated, hits, args.plot, title=f"{Path(args.model).name}: {where}")
    print(json.dumps({**cal.to_dict(), "exact_match": 100.0 * sum(hits) / len(hits),
                      "ece_before": expected_calibration_error(raw, hits),
                      "ece_after": expected_calibration_error(calibrated, hits), "written": str(out)}))
    return 0


def _read_json_map(path: str, what: str, value_type: type | tuple[type, ...]) -> dict:
    from ...data.files import read_json
    from ...errors import UserError

    obj = read_json(path, what)
    if not isinstance(obj, dict):
        raise UserError(f"{path}: expected a JSON object {{question id: ...}} ({what})")
    for k, v in obj.items():
        if isinstance(v, bool) or not isinstance(v, value_type):
            raise UserError(f"{path}: question {k!r}: expected a {getattr(value_type, '__name__', 'number')}, "
                            f"got {type(v).__name__} ({what})")
    return obj


def _calibration_result(data: dict, predictions: dict, scores: dict, args) -> dict:
    """The expected calibration error of ``scores`` against the predictions' exact match (and the reliability
    diagram with --calibration), over the questions that have both."""
    from ...errors import UserError
    from ...plots import expected_calibration_error, plot_reliability
    from .metric import exact_matches

    right = exact_matches(data, predictions)
    qids = [q for q in right if q in scores]
    if not qids:
        raise UserError(f"--scores {args.scores}: no score for any answered question of {args.data}")
    bad = [q for q in qids if not 0.0 <= scores[q] <= 1.0]
    if bad:
        raise UserError(f"--scores {args.scores}: question {bad[0]!r}: the score {scores[bad[0]]} is not in [0, 1]")
    confidences, hits = [float(scores[q]) for q in qids], [right[q] for q in qids]
    if args.calibration:
        plot_reliability(confidences, hits, args.calibration, title=f"{os.path.basename(args.scores)}")
    # Fractions, as the scores are (EM and F1 stay percentages, as the official script prints them).
    return {"ece": expected_calibration_error(confidences, hits), "ece_questions": len(qids),
            "mean_score": sum(confidences) / len(qids)}


def run_eval(args) -> int:
    from ...errors import UserError
    from ...plots import figure_format
    from .metric import evaluate, format_result
    from .squad import read_squad

    data = read_squad(args.data, args.articles)
    predictions = _read_json_map(args.predictions, "predictions", str)
    na_probs = _read_json_map(args.na_prob, "no-answer probabilities", (int, float)) if args.na_prob else None
    # The questions of blank paragraphs were skipped (and counted) by read_squad, as qa-predict skips
    # them: answers to them are neither scored nor reported again as ids the data does not have.
    for skipped in data["skipped_questions"]:
        predictions.pop(skipped, None)
        if na_probs is not None:
            na_probs.pop(skipped, None)
    if args.version is None and args.na_prob and not data["version"].lstrip("v").startswith("2"):
        args.version = "2.0"  # a no-answer probability file means v2.0 scoring
    if args.calibration and not args.scores:
        raise UserError("--calibration draws the scores' reliability: give --scores F (qa-predict --scores-out)")
    if args.calibration:
        figure_format(args.calibration, "--calibration")
    scores = _read_json_map(args.scores, "scores", (int, float)) if args.scores else None
    result = evaluate(data, predictions, na_probs, version=args.version, na_prob_thresh=args.na_prob_thresh,
                      strict=args.strict, source=args.predictions)
    if scores is not None:
        result.update(_calibration_result(data, predictions, scores, args))
    print(format_result(result))
    return 0


def run_ask(args) -> int:
    from ..._checks import check_text
    from ...data.files import read_text
    from ...errors import UserError
    from ...plots import figure_format, plot_span_probabilities
    from ..loading import cpu_threads
    from .predictor import answers_json

    if args.threads is None and args.input is None:
        # One question is a few milliseconds of work on one thread; a second thread saves little of it and, on a
        # machine busy with other work, waits for a core far longer. A file of questions gets torch's default.
        # (The command line puts the caller's count back when the command ends.)
        cpu_threads(1)
    # Bytes on the command line that are not UTF-8 reach sys.argv as lone surrogates (PEP 383); they
    # would fail later, far from the flag that brought them.
    for flag, value in (("--context", args.context), ("--question", args.question)):
        if value is not None:
            check_text(flag, value, at=f"{flag}: ", undecodable="pass UTF-8, or put the text in a file (--context-file)")
    if args.plot:
        figure_format(args.plot, "--plot")  # before minutes of loading
    if args.input is not None:
        if args.question is not None:
            raise UserError("--question: the questions come from --input; give one or the other")
        if args.plot:
            raise UserError("--plot draws one question; it cannot be used with --input")
        records, skipped = read_questions(args.input, skip_bad=args.skip_bad_lines)
        for message in skipped:
            print(f"ask: skipped {message}", file=sys.stderr)
        if skipped:
            print(f"ask: skipped {len(skipped)} bad line{'s' if len(skipped) > 1 else ''} of {args.input}; "
                  f"answering the other {len(records)}", file=sys.stderr)
        qa = _load_reader(args)
        qa.windows(args.max_context, args.stride)
        return _answer_file(qa, records, args)
    if args.skip_bad_lines:
        raise UserError("--skip-bad-lines skips lines of --input; there is none with --context")
    if args.question is None:
        raise UserError("--question is required with --context or --context-file")
    if args.context_file is not None:
        context = read_text(args.context_file, "--context-file")
    else:
        context = args.context
    check_text("the context", context, at="--context: ", blank=True)
    check_text("the question", args.question, at="--question: ", blank=True)
    qa = _load_reader(args)
    # With --plot, the probabilities drawn are those of the reading that found the answers (no second pass).
    answers, probs = qa.answer_with_probabilities(context, args.question, max_answer_len=args.max_answer_len,
                                                  top_k=args.top_k or 1, max_context=args.max_context,
                                                  stride=args.stride, min_score=args.min_score)
    if answers[0].abstained:
        print(f"ask: no confident answer (the best scores {answers[0].score:.3f}, under --min-score "
              f"{args.min_score})", file=sys.stderr)
    result = answers_json(answers)
    if args.plot:
        plot_span_probabilities(probs, answers[0], args.question, args.plot)
        result["plot"] = args.plot
    text = json.dumps(result, ensure_ascii=False, indent=2) + "\n"
    if args.output:
        from ...data.files import atomic_write_text

        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def _load_reader(args):
    from .predictor import QAModel

    return QAModel.load(args.model, layers=args.layers, device=resolve_device(args.device),
                        precision=args.precision)


def read_questions(path: str, *, skip_bad: bool = False) -> tuple[list[dict], list[str]]:
    """(the records, what was wrong with each skipped line) of a JSON-lines question file: ``{"id", "context",
    "question"}`` per non-blank line ("id" a str or int, the line number when absent). A line that is not such an
    object is a UserError naming the file and the line, or with ``skip_bad`` one message in the second list."""
    from ...data.files import read_text
    from ...errors import UserError

    records, skipped = [], []
    for number, line in enumerate(read_text(path, "--input").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(_question_record(line, f"{path}: line {number}", number))
        except UserError as e:
            if not skip_bad:
                raise
            skipped.append(str(e))
    if not records:
        raise UserError(f"{path}: no questions (expected one JSON object per line) (--input)"
                        + (f"; {len(skipped)} bad lines, the first: {skipped[0]}" if skipped else ""))
    return records, skipped


def _question_record(line: str, where: str, number: int) -> dict:
    """One line of a question file as ``{"id", "context", "question"}``; a UserError naming ``where``."""
    from ..._checks import check_text
    from ...errors import UserError

    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: malformed JSON at column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise UserError(f"{where}: the JSON is nested too deeply to read") from None
    if not isinstance(obj, dict):
        raise UserError(f'{where}: expected a JSON object {{"id", "context", "question"}}, got {type(obj).__name__}')
    for key in ("context", "question"):
        value = obj.get(key)
        if not isinstance(value, str):
            raise UserError(f"{where}: {key!r} must be a string" + ("" if key in obj else " (missing)"))
        check_text(f"the {key}", value, at=f"{where}: ", blank=True)  # a lone surrogate: a \ud800 escape
    qid = obj.get("id", number)
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise UserError(f"{where}: 'id' must be a string or an integer, got {type(qid).__name__}")
    return {"id": qid, "context": obj["context"], "question": obj["question"]}


def _answer_file(qa, records: list[dict], args) -> int:
    """One JSON line per record, in input order, to --output or stdout; answered in chunks so that the
    first lines come out before the last questions are read, and memory stays bounded."""
    import contextlib

    from ...data.files import atomic_open
    from .predictor import answers_json

    chunk = max(args.batch_size * 8, 256)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(atomic_open(args.output, "w", encoding="utf-8")) if args.output else sys.stdout
        for i in range(0, len(records), chunk):
            part = records[i:i + chunk]
            results = qa.answer_many([r["context"] for r in part], [r["question"] for r in part],
                                     batch_size=args.batch_size, max_answer_len=args.max_answer_len,
                                     top_k=args.top_k or 1, max_context=args.max_context, stride=args.stride,
                                     min_score=args.min_score)
            for record, answers in zip(part, results):
                out.write(json.dumps({"id": record["id"], **answers_json(answers)}, ensure_ascii=False) + "\n")
            out.flush()
    if args.output:
        print(f"ask: {len(records)} answers written to {args.output}", file=sys.stderr)
    return 0
