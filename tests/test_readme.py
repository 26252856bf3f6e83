"""The README runs: every ```python and ```sh block of README.md, read when the tests run (so the test follows
every edit of the README), is executed here, so that a snippet can never fail as written again.

Python blocks: each runs in a fresh ``sys.executable -c`` subprocess (cwd a temporary folder, one thread,
a timeout) with the README's own line numbers in its traceback; it must not raise. The blocks are
self-contained and use the shipped models (fastqa/pretrained/).

Shell blocks, line by line (a trailing backslash joins the next line, ``#`` starts a comment, blank lines are
skipped); each line is one test:

* ``fastqa ...`` runs for real as ``python -m fastqa ...`` in a temporary folder holding small generated data
  under the file names the README's commands use (found by scanning their file-like arguments: SQuAD-shaped
  JSON from tests/squad_fixtures.py with as many articles as the commands' ``A:B`` ranges need, a tiny vectors
  file of the dimension its name says, tiny parallel text, a context, questions); a name this fixture cannot
  make fails the line that reads it. A line that reads a run folder or file written by an earlier line (``--model
  runs/qanet``, ``export runs/qanet ...``, ``qa-eval ... pred.json``) runs that line first and uses what it made.
  The training commands (``qa-train``, ``mt-train``) get ``--max-steps 2 --eval-every 0`` and the tiny models'
  ``--set`` overrides of tests/tasks/test_qa_pipeline.py and tests/serve/conftest.py instead of their
  ``--max-minutes``: the README's runs take an hour, and this test proves that their command lines, files and
  flags are right, not the results. ``fastqa serve`` is started on a free port (``--port 0``; the port the README
  names is checked against the parsed default), its /health, page and /metrics are fetched, and it is stopped
  with SIGTERM. ``fastqa translate`` without ``--input`` reads a line from stdin. Each command must exit 0, and
  its output must be what the README's comment promises where that is cheap to check (qa-eval prints JSON with
  exact_match, translate --nbest N writes N hypotheses, the export holds safetensors, config and card, ...).
* ``fastqa download ...`` is only parsed (``fastqa.cli.build_parser().parse_args``): the tests have no network.
* ``pip install ...`` is checked for form only (no network here): every requirement is valid PEP 508, an install
  of torch pins the CPU wheel index or a version (a bare ``pip install torch`` pulls the CUDA wheels, several
  GB), and the extras named exist in pyproject.toml's ``[project.optional-dependencies]``.
* ``make TARGET``: the target exists in the Makefile; ``cd`` / ``export`` lines: parsed only.
* Any other line fails ("the README doc test does not know how to run: ..."), so that a new kind of line gets
  a decision here.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
from cli_helpers import launch_serve
from copy_corpus import TINY_CONVS2S
from squad_fixtures import make_squad

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TIMEOUT_S = 300  # per block or command; each takes seconds

# The tiny QANet of tests/tasks/test_qa_pipeline.py (TINY) and the tiny ConvS2S of tests/serve/conftest.py (MT_TINY).
QA_TINY = ["--set", "d_model=32", "--set", "heads=2", "--set", "char_dim=16", "--set", "char_channels=32",
           "--set", "word_dim=32", "--set", "emb_conv_layers=1", "--set", "model_blocks=1", "--set", "dropout=0",
           "--set", "char_dropout=0", "--set", "layer_dropout=0"]
MT_TINY = [*TINY_CONVS2S, "--set", "max_positions=32"]
TRAIN_OVERRIDES = {"qa-train": QA_TINY, "mt-train": MT_TINY}
TRAIN_STEPS = ["--max-steps", "2", "--eval-every", "0"]

# Destinations of the fastqa parsers whose values a command writes (everything else file-like is read).
OUTPUT_DESTS = {"out", "output", "json", "plot", "plot_attention", "calibration", "to"}

PYTHON_LANGS = {"python", "py"}
SHELL_LANGS = {"sh", "bash", "shell", "console"}
# Fenced blocks that are not code to run.
INERT_LANGS = {"bibtex", "text", "txt", "json", "toml", "yaml", "", "diff", "markdown", "md"}


# ------------------------------------------------------------------------------------------------ the README

@dataclass
class Block:
    lang: str
    start: int  # README line number of the block's first code line
    code: str


@dataclass
class ShLine:
    block: int      # README line of the block's first line
    lineno: int     # README line where this (possibly continued) line starts
    text: str       # the line as written, continuations joined
    argv: list[str]
    comment: str


def readme_blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of README.md, in order."""
    lines = (README.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^```\s*([\w+-]*)\s*$", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            blocks.append(Block(m.group(1).lower(), i + 2, "\n".join(lines[i + 1:j]) + "\n"))
            i = j
        i += 1
    return blocks


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment): ``#`` starts a comment at the start of a word outside quotes, as in sh."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k], line[k + 1:].strip()
    return line, ""


def shell_lines(blocks: list[Block] | None = None) -> list[ShLine]:
    """The lines of every shell block: continuations joined, comments split off, blank lines left out."""
    out = []
    for block in blocks if blocks is not None else readme_blocks():
        if block.lang not in SHELL_LANGS:
            continue
        raw = block.code.splitlines()
        k = 0
        while k < len(raw):
            start, parts = k, []
            while True:
                code, comment = split_comment(raw[k])
                if code.rstrip().endswith("\\") and k + 1 < len(raw):
                    parts.append(code.rstrip()[:-1])
                    k += 1
                    continue
                parts.append(code)
                break
            k += 1
            joined = " ".join(p.strip() for p in parts).strip()
            if not joined:
                continue
            if block.lang == "console" and joined.startswith("$ "):
                joined = joined[2:]
            out.append(ShLine(block.start, block.start + start, joined, shlex.split(joined), comment))
    return out


def _id(line: ShLine) -> str:
    words = [w for w in line.argv[:2] if re.fullmatch(r"[\w.-]+", w)]
    return f"L{line.lineno}-" + "-".join(words)


def test_readme_has_blocks_this_test_knows():
    """A block in a language this test neither runs nor knows to be inert (a ```bash block, say) fails here
    rather than going unchecked."""
    blocks = readme_blocks()
    unknown = [f"line {b.start - 1}: ```{b.lang}" for b in blocks
               if b.lang not in PYTHON_LANGS | SHELL_LANGS | INERT_LANGS]
    assert not unknown, f"README blocks the doc test does not know how to run: {unknown}"
    assert any(b.lang in PYTHON_LANGS for b in blocks) and any(b.lang in SHELL_LANGS for b in blocks)


def test_the_readme_parser():
    text = "x\n```sh\nfastqa a --b 'c # d' \\\n   --e f   # g\n\n# only a comment\nmake test\n```\n```python\nprint(1)\n```\n"
    blocks = readme_blocks(text)
    assert [(b.lang, b.start) for b in blocks] == [("sh", 3), ("python", 10)]
    lines = shell_lines(blocks)
    assert [(ln.lineno, ln.argv, ln.comment) for ln in lines] == [
        (3, ["fastqa", "a", "--b", "c # d", "--e", "f"], "g"), (7, ["make", "test"], "")]


# ---------------------------------------------------------------------------------------------- subprocesses

def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONIOENCODING="utf-8")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _missing_optional(stderr: str) -> str | None:
    """Why to skip a failure that is an optional package (the models or serve extra) missing here, as the
    suite's other tests skip (tests/conftest.py); None for any other failure."""
    import importlib.util

    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for extra in ("models", "serve"):
        for req in extras.get(extra, []):
            module = Requirement(req).name.replace("-", "_")
            if importlib.util.find_spec(module) is None and (module in stderr or f"fastqa[{extra}]" in stderr):
                return f"needs the optional package {module!r} (not installed here)"
    return None


def _tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


# The block is compiled with the README as its file name, padded to its README line, so a traceback names
# the README's line.
_PY_WRAPPER = """\
import sys
import torch
torch.set_num_threads(1)
path, start, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
exec(compile("\\n" * (start - 1) + code, path, "exec"), {"__name__": "__main__"})
"""


@pytest.mark.parametrize("block", [b for b in readme_blocks() if b.lang in PYTHON_LANGS],
                         ids=lambda b: f"python-L{b.start}")
def test_python_block(block, tmp_path):
    """Each ```python block of the README runs as written, alone, in a fresh interpreter."""
    first = block.code.strip().splitlines()[0]
    try:
        r = subprocess.run([sys.executable, "-c", _PY_WRAPPER, str(README), str(block.start), block.code],
                           cwd=tmp_path, env=_env(), capture_output=True, text=True, errors="replace",
                           timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README line {block.start}: the python block starting {first!r} did not finish in {TIMEOUT_S} s")
    if r.returncode != 0 and _missing_optional(r.stderr):
        pytest.skip(_missing_optional(r.stderr))
    assert r.returncode == 0, (f"README line {block.start}: the python block starting {first!r} failed "
                               f"(exit status {r.returncode}):\n{_tail(r.stderr)}")


# -------------------------------------------------------------------------------- what the commands read

def _file_like(token: str) -> bool:
    """A path argument: has a folder part or an extension with a letter; not a flag, number, range or sentence."""
    if token.startswith("-") or re.search(r"\s", token) or token.startswith(("http://", "https://")):
        return False
    return "/" in token or bool(re.search(r"\.[A-Za-z][A-Za-z0-9]*$", token))


def _parse(argv: list[str]):
    """(namespace, None) of ``fastqa ARGV``, or (None, argparse's message)."""
    from fastqa.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return build_parser().parse_args(argv), None
        except SystemExit as e:
            return None, err.getvalue().strip() or f"exit status {e.code}"


def _dests(ns) -> dict[str, str]:
    """{argument value: its destination} of a parsed namespace."""
    out = {}
    for dest, value in vars(ns).items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, (str, os.PathLike)):
                out.setdefault(os.fspath(v), dest)
    return out


@dataclass
class Command:
    """What one ``fastqa`` line reads and writes."""
    line: ShLine
    ns: Any
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)


def analyse(line: ShLine) -> Command | None:
    ns, _ = _parse(line.argv[1:])
    if ns is None:
        return None
    dests = _dests(ns)
    cmd = Command(line, ns)
    for token in line.argv[2:]:
        dest = dests.get(token)
        if dest in OUTPUT_DESTS or (dest or "").endswith("_out"):
            cmd.writes.append(token)
        elif _file_like(token):
            cmd.reads.append(token)
    return cmd


# ------------------------------------------------------------------------------------- the generated files

DE_EN = [("Ein Mann fährt Fahrrad.", "A man rides a bicycle."),
         ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
         ("Eine Frau liest ein Buch im Park.", "A woman reads a book in the park."),
         ("Kinder laufen am Strand.", "Children run on the beach."),
         ("Ein Junge springt ins Wasser.", "A boy jumps into the water."),
         ("Eine Gruppe von Menschen steht vor einem Gebäude.", "A group of people stands in front of a building."),
         ("Der Hund fängt einen Ball.", "The dog catches a ball."),
         ("Ein älterer Mann spielt Gitarre.", "An older man plays the guitar.")]
ARTICLE = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. It was designed by the "
           "company of Gustave Eiffel and completed in 1889 for the World's Fair.\n")
QUESTIONS = [{"id": "q1", "context": ARTICLE, "question": "When was the Eiffel Tower completed?"},
             {"id": "q2", "context": ARTICLE, "question": "Who designed the tower?"},
             {"id": "q3", "context": ARTICLE, "question": "Where is the Eiffel Tower?"}]
BAD_LINE = b"\xff\xfe not UTF-8 \xc3\x28\n"


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def _squad_articles(name: str, commands: list[Command]) -> int:
    """As many articles as the ``A:B`` ranges of the commands reading ``name`` reach (at least 4)."""
    need = 4
    for cmd in commands:
        if name in cmd.line.argv:
            for token in cmd.line.argv:
                m = re.fullmatch(r"(\d*):(\d+)", token)
                if m:
                    need = max(need, int(m.group(2)))
    return need


def _make_squad(path: Path, name: str, commands: list[Command], skip_bad: bool) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    return make_squad(path, articles=_squad_articles(name, commands), paragraphs=1, people=1, v2="v2" in name,
                      seed=5)


def _make_vectors(path: Path, name: str, commands: list[Command], skip_bad: bool) -> None:
    dim = int(re.search(r"(\d+)d", name).group(1))
    sample = make_squad(articles=4, paragraphs=2, people=2, seed=5)
    words = set()
    for article in sample["data"]:
        for para in article["paragraphs"]:
            texts = [para["context"], *(qa["question"] for qa in para["qas"])]
            for text in texts:
                words.update(w.lower() for w in re.findall(r"\w+", text))
    rng = random.Random(0)
    lines = [w + " " + " ".join(f"{rng.uniform(-1, 1):.4f}" for _ in range(dim)) for w in sorted(words)]
    _write(path, ("\n".join(lines) + "\n").encode("utf-8"))


def _make_parallel(path: Path, name: str, commands: list[Command], skip_bad: bool) -> None:
    lang = re.search(r"\.(de|en)(\.gz)?$", name).group(1)
    n = 200 if Path(name).name.startswith("train") else 8
    rng = random.Random(Path(name).name.split(".")[0])  # one seed per split: the .de and .en lines are pairs
    lines = [DE_EN[rng.randrange(len(DE_EN))][0 if lang == "de" else 1] for _ in range(n)]
    data = b"".join(line.encode("utf-8") + b"\n" for line in lines)
    if skip_bad:
        data = data[:data.index(b"\n") + 1] + BAD_LINE + data[data.index(b"\n") + 1:]
    _write(path, data)


def _make_questions(path: Path, name: str, commands: list[Command], skip_bad: bool) -> None:
    lines = [json.dumps(q, ensure_ascii=False) for q in QUESTIONS]
    if skip_bad:
        lines.insert(1, "not a JSON line")
    _write(path, ("\n".join(lines) + "\n").encode("utf-8"))


def _make_text(path: Path, name: str, commands: list[Command], skip_bad: bool) -> None:
    _write(path, ARTICLE.encode("utf-8"))


# First match wins; (pattern on the file name, maker).
MAKERS: list[tuple[str, Callable]] = [
    (r"(^|/)(train|dev)-v(1\.1|2\.0)[^/]*\.json(\.gz)?$", _make_squad),
    (r"(^|/)[^/]*\d+d[^/]*\.(txt|vec)(\.gz)?$", _make_vectors),
    (r"\.(de|en)(\.gz)?$", _make_parallel),
    (r"\.jsonl$", _make_questions),
    (r"\.txt$", _make_text),
]


@dataclass
class Outcome:
    ok: bool
    message: str = ""
    skip: str | None = None  # the failure is an optional package missing here


class Workspace:
    """The temporary folder the README's ``fastqa`` lines run in, its generated files, and each line's outcome
    (a line runs once, whether for its own test or for a later line that reads what it wrote)."""

    def __init__(self, root: Path, lines: list[ShLine]) -> None:
        self.root, self.lines = root, lines
        self.commands: dict[int, Command] = {}
        for k, line in enumerate(lines):
            if line.argv[0] == "fastqa":
                cmd = analyse(line)
                if cmd is not None:
                    self.commands[k] = cmd
        self.unmakeable: dict[str, str] = {}
        self.outcomes: dict[int, Outcome] = {}
        self.squad: dict[str, dict] = {}
        self._make_inputs()

    def producer(self, k: int, name: str) -> int | None:
        """The latest line before line ``k`` that writes ``name``."""
        earlier = [j for j, cmd in self.commands.items() if j < k and name in cmd.writes]
        return max(earlier) if earlier else None

    def _make_inputs(self) -> None:
        cmds = list(self.commands.values())
        for k, cmd in self.commands.items():
            for name in cmd.reads:
                if self.producer(k, name) is not None or (self.root / name).exists() or name in self.unmakeable:
                    continue
                maker = next((m for pattern, m in MAKERS if re.search(pattern, name)), None)
                if maker is None:
                    self.unmakeable[name] = (f"the README names a file the doc test cannot make: {name!r} "
                                             f"(README line {cmd.line.lineno}; add a maker to tests/test_readme.py)")
                    continue
                skip_bad = any(name in c.line.argv and "--skip-bad-lines" in c.line.argv for c in cmds)
                made = maker(self.root / name, name, cmds, skip_bad)
                if maker is _make_squad:
                    self.squad[name] = made

    def outcome(self, k: int) -> Outcome:
        if k not in self.outcomes:
            try:
                self._run(k)
                self.outcomes[k] = Outcome(True)
            except Exception as e:  # noqa: BLE001 -- the line's test reports it, and so does every line that needs it
                line = self.commands[k].line
                message = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
                if not message.startswith("README line"):
                    message = f"README line {line.lineno}: {line.text}\n{message}"
                self.outcomes[k] = Outcome(False, message, getattr(e, "skip", None) or _missing_optional(message))
        return self.outcomes[k]

    def _run(self, k: int) -> None:
        cmd = self.commands[k]
        line = cmd.line
        for name in cmd.reads:
            assert name not in self.unmakeable, self.unmakeable[name]
            j = self.producer(k, name)
            if j is not None:
                dep = self.outcome(j)
                if dep.skip:
                    raise _Skipped(dep.skip)
                assert dep.ok, f"{name} is written by README line {self.lines[j].lineno}, which failed:\n{dep.message}"
        command, args = line.argv[1], line.argv[2:]
        if command in TRAIN_OVERRIDES:
            args = _training_args(args)
        if command == "serve":
            _run_serve(self, cmd, args)
            return
        stdin = ""
        if command == "translate" and cmd.ns.input is None:
            stdin = DE_EN[0][0] + "\n"
        r = subprocess.run([sys.executable, "-m", "fastqa", command, *args], cwd=self.root, env=_env(), input=stdin,
                           capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
        assert r.returncode == 0, (f"README line {line.lineno}: {line.text}\nexit status {r.returncode}; "
                                   f"ran: fastqa {command} {shlex.join(args)}\n{_tail(r.stderr)}")
        check = CHECKS.get(command)
        if check is not None:
            check(self, cmd, r)


class _Skipped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.skip = reason


def _training_args(args: list[str]) -> list[str]:
    """The README's training line without --max-minutes, with 2 steps, one evaluation and the tiny model.
    With --vectors the vectors set word_dim, so the tiny model's word_dim is left out."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--max-minutes":
            skip = True
            continue
        if a.startswith("--max-minutes="):
            continue
        out.append(a)
    command = "qa-train" if "--train" in args else "mt-train"
    tiny = list(TRAIN_OVERRIDES[command])
    if "--vectors" in args and "word_dim=32" in tiny:
        at = tiny.index("word_dim=32")
        del tiny[at - 1:at + 1]
    return [*out, *TRAIN_STEPS, *tiny]


# --------------------------------------------------------------------------- what the README's comments promise

def _json_lines(text: str) -> list[dict]:
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


def _check_info(ws: Workspace, cmd: Command, r) -> None:
    info = json.loads(r.stdout)  # backends, versions, threads
    assert {"fastqa", "torch", "backends"} <= set(info) and info["backends"].get("reference"), info
    assert "threads" in r.stdout


def _check_ask(ws: Workspace, cmd: Command, r) -> None:
    ns = cmd.ns
    text = (ws.root / ns.output).read_text(encoding="utf-8") if ns.output else r.stdout
    if ns.input:
        results = _json_lines(text)
        lines = (ws.root / ns.input).read_text(encoding="utf-8").splitlines()
        good = [json.loads(ln) for ln in lines if ln.strip().startswith("{")]
        assert [res["id"] for res in results] == [q["id"] for q in good], results  # one answer per question
        contexts = {q["id"]: q["context"] for q in good}
    else:
        results = [json.loads(text)]
        context = ns.context if ns.context is not None else (ws.root / ns.context_file).read_text(encoding="utf-8")
        contexts = {None: context}
    for res in results:
        context = contexts[res.get("id")]
        answers = res.get("answers", [res["answer"]])
        assert answers and answers[0] == res["answer"], res
        if ns.top_k:
            assert len(answers) <= ns.top_k, res
        for a in answers:
            assert a["abstained"] or a["text"] == context[a["start"]:a["end"]], a
            if ns.min_score is not None:
                assert a["abstained"] or a["score"] >= ns.min_score, a


def _check_translate(ws: Workspace, cmd: Command, r) -> None:
    ns = cmd.ns
    out = r.stdout.splitlines()
    if ns.input is None:
        sources = [DE_EN[0][0]]
    else:
        sources = (ws.root / ns.input).read_bytes().split(b"\n")[:-1]
    per = ns.nbest or 1
    if ns.json:
        return
    assert len(out) == per * len(sources), f"{len(sources)} lines in, {len(out)} out:\n{r.stdout}"
    for k, src in enumerate(sources):
        mine = out[k * per:(k + 1) * per]
        if isinstance(src, bytes) and src + b"\n" == BAD_LINE:  # "a line that is not UTF-8: an empty line"
            assert all(not m.split("\t")[-1].strip() for m in mine), mine
            continue
        if per > 1:
            assert all(m.startswith("H-") for m in mine), mine  # H-<line><TAB><score><TAB><text>
        assert all(m.split("\t")[-1].strip() for m in mine), mine


def _check_qa_train(ws: Workspace, cmd: Command, r) -> None:
    out = ws.root / cmd.ns.out
    assert (out / "checkpoint.pt").is_file() and (out / "metrics.jsonl").is_file(), sorted(os.listdir(out))


def _check_mt_train(ws: Workspace, cmd: Command, r) -> None:
    from fastqa.train.checkpoint import load_checkpoint

    out = ws.root / cmd.ns.out
    assert (out / "checkpoint.pt").is_file(), sorted(os.listdir(out))
    meta = load_checkpoint(out)["meta"]
    if "SentencePiece" in cmd.line.comment:
        assert meta["vocab"]["kind"] == "subword", meta.get("vocab")
    if "cased" in cmd.line.comment.split():
        assert meta["text"]["lowercase"] is False, meta["text"]


def _check_qa_predict(ws: Workspace, cmd: Command, r) -> None:
    pred = json.loads((ws.root / cmd.ns.out).read_text(encoding="utf-8"))
    squad = ws.squad.get(cmd.ns.data)
    if squad is not None:  # one answer per question of the articles asked for
        a, b = (int(x) if x else None for x in (cmd.ns.articles or ":").split(":"))
        ids = {qa["id"] for art in squad["data"][a:b] for p in art["paragraphs"] for qa in p["qas"]}
        assert set(pred) == ids, f"{len(pred)} predictions for {len(ids)} questions"
    assert all(isinstance(v, str) for v in pred.values())


def _check_qa_eval(ws: Workspace, cmd: Command, r) -> None:
    result = json.loads(r.stdout)  # official EM/F1
    assert "f1" in result and ("exact_match" in result or "exact" in result), result


def _check_mt_eval(ws: Workspace, cmd: Command, r) -> None:
    # sacreBLEU, chrF
    assert "BLEU" in r.stdout and "chrF" in r.stdout, r.stdout


def _check_export(ws: Workspace, cmd: Command, r) -> None:
    out = ws.root / cmd.ns.out
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "README.md"} <= files, files  # safetensors, config, model card
    if cmd.ns.half:
        from safetensors import safe_open

        with safe_open(str(out / "model.safetensors"), "pt") as f:
            dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
        assert "F16" in dtypes and "F32" not in dtypes, dtypes


CHECKS: dict[str, Callable] = {"info": _check_info, "ask": _check_ask, "translate": _check_translate,
                               "qa-train": _check_qa_train, "mt-train": _check_mt_train,
                               "qa-predict": _check_qa_predict, "qa-eval": _check_qa_eval,
                               "mt-eval": _check_mt_eval, "export": _check_export}


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def _run_serve(ws: Workspace, cmd: Command, args: list[str]) -> None:
    """``fastqa serve ARGS --port 0``: the address line, /health, the page and /metrics, then SIGTERM."""
    line = cmd.line
    port = re.search(r":(\d{2,5})\b", line.comment)
    if port and "--port" not in args:  # the README's port is the default one
        assert cmd.ns.port == int(port.group(1)), f"README line {line.lineno} says :{port.group(1)}, the default is {cmd.ns.port}"
    log = ws.root / f"serve-{line.lineno}.log"
    process, url = launch_serve([*args, "--port", "0"], log, timeout=TIMEOUT_S, cwd=ws.root, env=_env())
    try:
        assert url is not None, (f"README line {line.lineno}: fastqa serve did not start:\n"
                                 f"{_tail(log.read_text(encoding='utf-8'))}")
        deadline = time.monotonic() + 60
        while True:
            try:
                if _get(url + "/health") == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"/health does not answer:\n{_tail(log.read_text(encoding='utf-8'))}"
            time.sleep(0.2)
        assert _get(url + "/") == 200  # a page
        if "/metrics" in line.comment:
            assert _get(url + "/metrics") == 200
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            rc = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            rc = None
    # uvicorn shuts down gracefully, then re-raises SIGTERM so that the process ends as killed by it
    assert rc in (0, -signal.SIGTERM), f"fastqa serve stopped with {rc} on SIGTERM:\n{_tail(log.read_text(encoding='utf-8'))}"


# ------------------------------------------------------------------------------------------- pip, make, ...

_PIP_VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-r", "--requirement", "-c", "--constraint",
                      "-e", "--editable", "-t", "--target", "-C", "--config-settings", "-f", "--find-links",
                      "--platform", "--python-version", "--prefix", "--root", "--upgrade-strategy",
                      "--no-binary", "--only-binary", "--progress-bar", "--src", "--implementation", "--abi"}


def check_pip(line: ShLine) -> None:
    """A pip install line: valid requirements, torch pinned to the CPU index or a version, known extras."""
    from packaging.requirements import InvalidRequirement, Requirement

    argv = line.argv
    start = 3 if argv[0].startswith("python") else 1
    assert argv[start:start + 1] == ["install"], f"README line {line.lineno}: only `pip install` lines are known: {line.text}"
    options: dict[str, str] = {}
    targets: list[str] = []
    args = iter(argv[start + 1:])
    for a in args:
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if name in _PIP_VALUE_OPTIONS and not eq:
                value = next(args, "")
                assert value, f"README line {line.lineno}: {name} without its value"
            options[name] = value
        else:
            targets.append(a)
    assert targets, f"README line {line.lineno}: pip install of nothing: {line.text}"
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
                 .get("optional-dependencies", {}))
    index = options.get("--index-url", options.get("-i", ""))
    for target in targets:
        local = re.fullmatch(r"(\.{1,2}|\.?\.?/[^\[\]]*)(\[([\w,\s-]*)\])?", target)
        if local:
            named = [e.strip() for e in (local.group(3) or "").split(",") if e.strip()]
        else:
            try:
                req = Requirement(target)
            except InvalidRequirement as e:
                raise AssertionError(f"README line {line.lineno}: {target!r} is not a valid requirement ({e})") from None
            named = sorted(req.extras) if req.name.lower() == "fastqa" else []
            if req.name.lower() == "torch":
                pinned = any(s.operator in ("==", "===") for s in req.specifier)
                assert pinned or re.search(r"/whl/cpu/?$", index), (
                    f"README line {line.lineno}: {line.text}\n`pip install torch` without the CPU index "
                    "(--index-url https://download.pytorch.org/whl/cpu) or a version pin pulls the CUDA wheels")
        unknown = [e for e in named if e not in extras]
        assert not unknown, (f"README line {line.lineno}: extras {unknown} are not in pyproject.toml's "
                             f"[project.optional-dependencies] ({sorted(extras)})")


def check_make(line: ShLine) -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, flags=re.M))
    wanted = [a for a in line.argv[1:] if not a.startswith("-") and "=" not in a]
    unknown = [t for t in wanted if t not in targets]
    assert not unknown, f"README line {line.lineno}: {line.text}\nno such Makefile target: {unknown}"


def _line(text: str) -> ShLine:
    return ShLine(1, 1, text, shlex.split(text), "")


def test_the_form_checks(tmp_path):
    """What the checks of the lines that cannot run here reject."""
    check_pip(_line("pip install torch --index-url https://download.pytorch.org/whl/cpu"))
    check_pip(_line('pip install "torch==2.13.0" "cmake>=3.18" ninja'))
    check_pip(_line('pip install -v --no-build-isolation ".[models,serve]"'))
    for bad, why in [("pip install torch", "CUDA wheels"), ("pip install 'torch>=2.4'", "CUDA wheels"),
                     ('pip install --no-build-isolation ".[modles]"', "modles"), ("pip install 'cmake>>3'", "valid"),
                     ("pip install fastqa[nope]", "nope")]:
        with pytest.raises(AssertionError, match=why):
            check_pip(_line(bad))
    check_make(_line("make test PYTEST_ARGS=-x"))
    with pytest.raises(AssertionError, match="no such Makefile target"):
        check_make(_line("make tset"))
    ws = Workspace(tmp_path, [_line("fastqa qa-eval scores.csv pred.json")])
    assert "scores.csv" in ws.unmakeable and not (tmp_path / "pred.json").exists()
    with pytest.raises(AssertionError, match="cannot make: 'scores.csv'"):
        ws._run(0)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("readme"), shell_lines())


_SH_LINES = shell_lines()


@pytest.mark.parametrize("k", range(len(_SH_LINES)), ids=[_id(ln) for ln in _SH_LINES])
def test_shell_line(k, workspace):
    """One line of a ```sh block of the README: run, or checked for form where it cannot run here."""
    line = workspace.lines[k]
    argv = line.argv
    where = f"README line {line.lineno}: {line.text}"
    if argv[0] == "fastqa":
        ns, error = _parse(argv[1:])
        assert ns is not None, f"{where}\n{error}"
        if argv[1] == "download":
            return  # parsed only: the tests have no network
        outcome = workspace.outcome(k)
        if outcome.skip:
            pytest.skip(outcome.skip)
        assert outcome.ok, outcome.message
    elif argv[0] in ("pip", "pip3") or argv[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
        check_pip(line)
    elif argv[0] == "make":
        check_make(line)
    elif argv[0] in ("cd", "export"):
        pass  # parsed only (shlex)
    else:
        pytest.fail(f"the README doc test does not know how to run: {line.text} (README line {line.lineno}); "
                    "teach tests/test_readme.py")
