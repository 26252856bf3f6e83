"""The docs run: every ```sh block of README.md and docs/*.md, and every ```python block of README.md, read when
the tests run (so the test follows every edit of the docs), is executed here, so that a documented command can
never fail as written again. (docs/*.md's ```python blocks are fragments over names they leave undefined, such
as ``context_words`` or ``long_text``, and are not run.)

Python blocks: each runs in a fresh ``sys.executable -c`` subprocess (cwd a temporary folder, one thread,
a timeout) with the README's own line numbers in its traceback; it must not raise. The blocks are
self-contained and use the shipped models (fastqa/pretrained/).

Shell blocks, line by line (a trailing backslash joins the next line, ``#`` starts a comment, blank lines are
skipped, ``VAR=value`` words before the command are its environment); each line is one test. Each document's
lines run in a temporary folder of their own, in order where one reads what another wrote:

* ``fastqa ...`` runs for real as ``python -m fastqa ...`` in that folder, which holds small generated data
  under the file names the commands use (found by scanning their file-like arguments: SQuAD-shaped JSON from
  tests/squad_fixtures.py with as many articles as the commands' ``A:B`` ranges need, a tiny vectors file of
  the dimension its name says, tiny parallel text, a context, questions, a file of translations holding the
  reference's lines); a name this fixture cannot make fails the line that reads it. A line that reads a run
  folder or file written by an earlier line (``--model runs/qanet``, ``export runs/qanet ...``, ``qa-eval ...
  pred.json``) runs that line first and uses what it made. The training commands (``qa-train``, ``mt-train``)
  get ``--max-steps 2 --eval-every 0`` and the tiny models' ``--set`` overrides of
  tests/tasks/test_qa_pipeline.py and tests/serve/conftest.py instead of their ``--max-minutes``: the documented
  runs take an hour, and this test proves that their command lines, files and flags are right, not the results.
  ``fastqa serve`` is started on a free port (``--port 0`` appended; the port a comment names is checked
  against the parsed one), its /health, page and /metrics are fetched, every ``curl`` line of the document
  addressed to that port runs against it, and it is stopped with SIGTERM. ``fastqa translate`` without
  ``--input`` reads a line from stdin. Each command must exit 0, and its output must be what the comment
  promises where that is cheap to check (qa-eval prints JSON with exact_match, translate --nbest N writes N
  hypotheses, the export holds safetensors, config and card, curl gets the answers, not an error, ...).
* What stands in for what the tests cannot have, mechanically:

  =============================================  ================================================================
  documented                                     here
  =============================================  ================================================================
  ``runs/NAME`` read, written by no earlier      a copy of the shipped model of the command's task
  line of the document                           (``qanet-small-squad`` for ``--qa-model`` and the QA commands'
                                                 ``--model``, ``convs2s-small-multi30k`` for ``--mt-model`` and
                                                 the translation commands'): a trained model, an export
  ``$SQUAD``, ``$GLOVE``, ``$MULTI30K``          ``data/squad``, ``data/glove``, ``data/multi30k`` (the folders
                                                 ``fastqa download ... --to data`` writes), holding generated data
  ``$OUT``                                       ``gpu-check-results``
  ``curl ... localhost:PORT/...``                the address of the ``fastqa serve`` line serving PORT
  ``python -m benchmarks[.cases_*] ARGS``        ``... ARGS --list``: the cases the filters select (at least one);
                                                 timing them takes minutes and means nothing on a busy machine
  ``python -m benchmarks.compare OLD NEW``       both files a copy of a recorded result in benchmarks/results/
  ``pytest ARGS``                                ``pytest ARGS --collect-only``: the options exist, the tests load
  ``torchrun ... -m fastqa CMD ...``             parsed: torchrun's options by its own parser, ``fastqa CMD`` by
                                                 fastqa's (``...`` stands for the flags of the line above;
                                                 tests/train runs DDP itself)
  ``sh docs/runs/NAME/train.sh``               parsed: the script's syntax (``sh -n``), every ``fastqa`` command
                                                 in it by fastqa's parser, and the variables it requires
                                                 exported by an earlier line of the document
  ``bash scripts/gpu_check.sh OUT ARGS``         parsed (it needs a CUDA GPU): the wrapper's syntax and ARGS by
                                                 the check's own parser (tests/test_gpu_check.py runs the check)
  ``fastqa download ...``                        parsed only: the tests have no network
  =============================================  ================================================================

* ``pip install ...`` is checked for form only (no network here): every requirement is valid PEP 508, an install
  of torch pins the CPU wheel index or a version (a bare ``pip install torch`` pulls the CUDA wheels, several
  GB), and the extras named exist in pyproject.toml's ``[project.optional-dependencies]``.
* ``make TARGET``: the target exists in the Makefile; ``cd`` / ``export`` lines: parsed only.
* Any other line fails ("the doc test does not know how to run: ..."), so that a new kind of line gets
  a decision here.
"""
from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import json
import os
import random
import re
import shlex
import shutil
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
from helpers import load_script
from copy_corpus import TINY_CONVS2S
from squad_fixtures import make_squad

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT_S = 300  # per block or command; each takes seconds

# The variables the documented scripts read: the folders `fastqa download ... --to data` writes, and the GPU
# check's output folder.
DOC_ENV = {"SQUAD": "data/squad", "GLOVE": "data/glove", "MULTI30K": "data/multi30k", "OUT": "gpu-check-results"}
# The shipped model standing in for a run folder no line of the document trains, by the task of the flag.
STANDINS = {"qa": "qanet-small-squad", "mt": "convs2s-small-multi30k"}
QA_COMMANDS = {"ask", "qa-predict", "qa-calibrate", "qa-eval"}
MT_COMMANDS = {"translate", "mt-eval"}
# A recorded benchmark result, what `python -m benchmarks.compare` reads.
RECORDED_BENCH = REPO / "benchmarks" / "results" / "cpu-intel-xeon-avx512-2threads-2026-11-26.json"

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
    start: int  # line number of the block's first code line in its document
    code: str


@dataclass
class ShLine:
    block: int      # line of the block's first line in its document
    lineno: int     # line where this (possibly continued) line starts
    text: str       # the line as written, continuations joined
    argv: list[str]  # the command's words: its leading VAR=value words left out, $VAR expanded by DOC_ENV
    comment: str
    doc: str = "README.md"  # the document, relative to the repository
    env: dict[str, str] = field(default_factory=dict)  # the leading VAR=value words

    @property
    def where(self) -> str:
        return f"{self.doc} line {self.lineno}"


def readme_blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of README.md (or of ``text``), in order."""
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


def _expand(word: str) -> str:
    """``$VAR`` and ``${VAR}`` of DOC_ENV replaced by their stand-ins; other text as it is."""
    return re.sub(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", lambda m: DOC_ENV.get(m.group(1), m.group(0)), word)


def _command(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the leading VAR=value words, the rest with DOC_ENV's variables expanded)."""
    env = {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]) and len(words) > 1:
        name, _, value = words[0].partition("=")
        env[name], words = value, words[1:]
    return env, [_expand(w) for w in words]


def doc_name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def shell_lines(blocks: list[Block] | None = None, doc: str = "README.md") -> list[ShLine]:
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
            env, argv = _command(shlex.split(joined))
            out.append(ShLine(block.start, block.start + start, joined, argv, comment, doc, env))
    return out


def doc_lines(path: Path) -> list[ShLine]:
    """The shell lines of one document."""
    return shell_lines(readme_blocks(path.read_text(encoding="utf-8")), doc_name(path))


def _id(line: ShLine) -> str:
    words = [w for w in line.argv[:3] if re.fullmatch(r"[\w.-]+", w) and not w.startswith("-")]
    return f"{Path(line.doc).stem}-L{line.lineno}-" + "-".join(words)


@pytest.mark.parametrize("path", DOCS, ids=doc_name)
def test_docs_have_blocks_this_test_knows(path):
    """A block in a language this test neither runs nor knows to be inert (a ```bash block, say) fails here
    rather than going unchecked."""
    blocks = readme_blocks(path.read_text(encoding="utf-8"))
    unknown = [f"line {b.start - 1}: ```{b.lang}" for b in blocks
               if b.lang not in PYTHON_LANGS | SHELL_LANGS | INERT_LANGS]
    assert not unknown, f"{doc_name(path)} blocks the doc test does not know how to run: {unknown}"
    if path == README:
        assert any(b.lang in PYTHON_LANGS for b in blocks) and any(b.lang in SHELL_LANGS for b in blocks)


def test_the_readme_parser():
    text = ("x\n```sh\nfastqa a --b 'c # d' \\\n   --e f   # g\n\n# only a comment\nmake test\n"
            "OMP_NUM_THREADS=1 fastqa b --data \"$SQUAD/x.json\" ${GLOVE}/y $HOME\n```\n```python\nprint(1)\n```\n")
    blocks = readme_blocks(text)
    assert [(b.lang, b.start) for b in blocks] == [("sh", 3), ("python", 11)]
    lines = shell_lines(blocks, "docs/x.md")
    assert [(ln.lineno, ln.argv, ln.comment, ln.env) for ln in lines] == [
        (3, ["fastqa", "a", "--b", "c # d", "--e", "f"], "g", {}), (7, ["make", "test"], "", {}),
        (8, ["fastqa", "b", "--data", "data/squad/x.json", "data/glove/y", "$HOME"], "", {"OMP_NUM_THREADS": "1"})]
    assert lines[2].where == "docs/x.md line 8"


# ---------------------------------------------------------------------------------------------- subprocesses

def _env(line_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a documented command: one thread, the checkout importable, the line's own VAR=value."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8", **(line_env or {})})
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


def _parallel_lines(name: str) -> list[str]:
    lang = re.search(r"\.(de|en)(\.gz)?$", name).group(1)
    n = 200 if Path(name).name.startswith("train") else 8
    rng = random.Random(Path(name).name.split(".")[0])  # one seed per split: the .de and .en lines are pairs
    return [DE_EN[rng.randrange(len(DE_EN))][0 if lang == "de" else 1] for _ in range(n)]


def _make_parallel(path: Path, name: str, commands: list[Command], skip_bad: bool) -> None:
    data = b"".join(line.encode("utf-8") + b"\n" for line in _parallel_lines(name))
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
def _make_hypotheses(path: Path, name: str, commands: list[Command], skip_bad: bool) -> None:
    """``--hyp FILE``: the lines of the reference the same command names (so the line counts agree)."""
    cmd = next(c for c in commands if getattr(c.ns, "hyp", None) == name)
    _write(path, "".join(line + "\n" for line in _parallel_lines(cmd.ns.ref)).encode("utf-8"))


def _task_of(name: str, cmd: Command) -> str | None:
    """"qa" or "mt": the task of the model ``cmd`` reads as ``name``; None when it reads no model there."""
    dest = _dests(cmd.ns).get(name)
    if dest in ("qa_model", "mt_model"):
        return dest[:2]
    if dest == "model":
        command = cmd.line.argv[1]
        return "qa" if command in QA_COMMANDS else "mt" if command in MT_COMMANDS else None
    return None


def _make_standin(path: Path, name: str, commands: list[Command], skip_bad: bool) -> None:
    """A run folder no line trains: a copy of the shipped model of the task of the flag that reads it."""
    from fastqa import pretrained

    tasks = {_task_of(name, c) for c in commands if name in c.line.argv} - {None}
    assert len(tasks) == 1, f"{name} is read as a model of {sorted(tasks) or 'no'} task(s); cannot stand in for it"
    shutil.copytree(pretrained.resolve(STANDINS[tasks.pop()]), path)


MAKERS: list[tuple[str, Callable]] = [
    (r"(^|/)(train|dev)(-v(1\.1|2\.0)[^/]*)?\.json(\.gz)?$", _make_squad),
    (r"(^|/)[^/]*\d+d[^/]*\.(txt|vec)(\.gz)?$", _make_vectors),
    (r"\.(de|en)(\.gz)?$", _make_parallel),
    (r"\.jsonl$", _make_questions),
    (r"(^|/)(translations|hyp)[^/]*\.txt$", _make_hypotheses),
    (r"\.txt$", _make_text),
    (r"^runs/[^/]+/?$", _make_standin),
]


@dataclass
class Outcome:
    ok: bool
    message: str = ""
    skip: str | None = None  # the failure is an optional package missing here


class Workspace:
    """The temporary folder one document's ``fastqa`` and ``curl`` lines run in, its generated files, and each
    line's outcome (a line runs once, whether for its own test or for a later line that reads what it wrote; a
    ``curl`` line runs while the ``fastqa serve`` line serving its port runs)."""

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
        self.servers: dict[int, int | None] = {k: self._server_of(k) for k, line in enumerate(lines)
                                              if line.argv[0] == "curl"}
        self._make_inputs()

    def producer(self, k: int, name: str) -> int | None:
        """The latest line before line ``k`` that writes ``name``."""
        earlier = [j for j, cmd in self.commands.items() if j < k and name in cmd.writes]
        return max(earlier) if earlier else None

    def _server_of(self, k: int) -> int | None:
        """The latest ``fastqa serve`` line before the curl line ``k`` that serves the port its URL names."""
        port = _curl_port(self.lines[k])
        serving = [j for j, cmd in self.commands.items()
                   if j < k and cmd.line.argv[1] == "serve" and port is not None and cmd.ns.port == port]
        return max(serving) if serving else None

    def curls_of(self, j: int) -> list[int]:
        return [k for k, server in self.servers.items() if server == j]

    def _make_inputs(self) -> None:
        cmds = list(self.commands.values())
        for k, cmd in self.commands.items():
            for name in cmd.reads:
                if self.producer(k, name) is not None or (self.root / name).exists() or name in self.unmakeable:
                    continue
                maker = next((m for pattern, m in MAKERS if re.search(pattern, name)), None)
                if maker is None:
                    self.unmakeable[name] = (f"the doc names a file the doc test cannot make: {name!r} "
                                             f"({cmd.line.where}; add a maker to tests/test_readme.py)")
                    continue
                skip_bad = any(name in c.line.argv and "--skip-bad-lines" in c.line.argv for c in cmds)
                made = maker(self.root / name, name, cmds, skip_bad)
                if maker is _make_squad:
                    self.squad[name] = made

    def _failed(self, line: ShLine, e: Exception) -> Outcome:
        message = str(e) if isinstance(e, AssertionError) else f"{type(e).__name__}: {e}"
        if not message.startswith(line.where):
            message = f"{line.where}: {line.text}\n{message}"
        return Outcome(False, message, getattr(e, "skip", None) or _missing_optional(message))

    def outcome(self, k: int) -> Outcome:
        if k in self.servers:  # a curl line: it runs while its server runs
            j = self.servers[k]
            line = self.lines[k]
            if j is None:
                return Outcome(False, f"{line.where}: {line.text}\nno `fastqa serve` line before it serves port "
                                      f"{_curl_port(line)}")
            served = self.outcome(j)
            if k not in self.outcomes:  # the server did not get as far as the curl lines
                return Outcome(False, f"{line.where}: {line.text}\nits server, {self.lines[j].where}, failed:\n"
                                      f"{served.message}", served.skip)
            return self.outcomes[k]
        if k not in self.outcomes:
            try:
                self._run(k)
                self.outcomes[k] = Outcome(True)
            except Exception as e:  # noqa: BLE001 -- the line's test reports it, and so does every line that needs it
                self.outcomes[k] = self._failed(self.commands[k].line, e)
        return self.outcomes[k]

    def run_curl(self, k: int, url: str) -> None:
        """Curl line ``k`` against the server at ``url``; its outcome recorded."""
        try:
            _run_curl(self, self.lines[k], url)
            self.outcomes[k] = Outcome(True)
        except Exception as e:  # noqa: BLE001 -- the curl line's own test reports it
            self.outcomes[k] = self._failed(self.lines[k], e)

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
                assert dep.ok, f"{name} is written by {self.lines[j].where}, which failed:\n{dep.message}"
        command, args = line.argv[1], line.argv[2:]
        if command in TRAIN_OVERRIDES:
            args = _training_args(args)
        if command == "serve":
            _run_serve(self, k, cmd, args)
            return
        stdin = ""
        if command == "translate" and cmd.ns.input is None:
            stdin = DE_EN[0][0] + "\n"
        r = subprocess.run([sys.executable, "-m", "fastqa", command, *args], cwd=self.root, env=_env(line.env),
                           input=stdin, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
        assert r.returncode == 0, (f"{line.where}: {line.text}\nexit status {r.returncode}; "
                                   f"ran: fastqa {command} {shlex.join(args)}\n{_tail(r.stderr)}")
        check = CHECKS.get(command)
        if check is not None:
            check(self, cmd, r)


class _Skipped(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.skip = reason


def _training_args(args: list[str]) -> list[str]:
    """A documented training line without --max-minutes, with 2 steps, one evaluation and the tiny model.
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


def _run_serve(ws: Workspace, k: int, cmd: Command, args: list[str]) -> None:
    """``fastqa serve ARGS --port 0``: the address line, /health, the page and /metrics, the document's curl
    lines addressed to its port, then SIGTERM."""
    line = cmd.line
    port = re.search(r":(\d{2,5})\b", line.comment)
    if port:  # the port the comment names is the one the line serves
        assert cmd.ns.port == int(port.group(1)), f"{line.where} says :{port.group(1)}, the line serves {cmd.ns.port}"
    log = ws.root / f"serve-{line.lineno}.log"
    process, url = launch_serve([*args, "--port", "0"], log, timeout=TIMEOUT_S, cwd=ws.root, env=_env(line.env))
    try:
        assert url is not None, (f"{line.where}: fastqa serve did not start:\n"
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
        for curl in ws.curls_of(k):
            ws.run_curl(curl, url)
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


_LOCAL_URL = re.compile(r"^(https?://)?(localhost|127\.0\.0\.1)(:(\d+))?(?=/|$)")


def _curl_port(line: ShLine) -> int | None:
    """The port of the local address a curl line names (80 when it names none), or None."""
    for word in line.argv[1:]:
        m = _LOCAL_URL.match(word)
        if m:
            return int(m.group(4) or 80)
    return None


def _run_curl(ws: Workspace, line: ShLine, url: str) -> None:
    """The curl line as written, its local address replaced by the running server's ``url``: exit status 0 and
    the JSON the route answers (not an error)."""
    if shutil.which("curl") is None:
        raise _Skipped("curl is not installed here")
    argv = [_LOCAL_URL.sub(url, w) for w in line.argv]
    route = next(_LOCAL_URL.sub("", w) for w in line.argv[1:] if _LOCAL_URL.match(w))
    r = subprocess.run(argv, cwd=ws.root, capture_output=True, text=True, timeout=TIMEOUT_S,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"curl exited with {r.returncode}: {r.stderr}"
    body = json.loads(r.stdout)
    assert isinstance(body, dict) and "error" not in body, f"{shlex.join(argv)}\nanswered {r.stdout}"
    data = next((argv[i + 1] for i, w in enumerate(argv[:-1]) if w in ("-d", "--data", "--data-raw")), None)
    sent = json.loads(data) if data is not None else {}
    if route == "/answer":  # the answers, best first, each a span of the context sent
        answers = body["answers"]
        assert answers and answers[0] == body["answer"] and len(answers) <= sent.get("top_k", 1), body
        assert all(a["abstained"] or sent["context"][a["start"]:a["end"]] == a["text"] for a in answers), body
    elif route == "/translate":
        assert body["translations"] and all(t["text"] for t in body["translations"]), body


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
    assert argv[start:start + 1] == ["install"], f"{line.where}: only `pip install` lines are known: {line.text}"
    options: dict[str, str] = {}
    targets: list[str] = []
    args = iter(argv[start + 1:])
    for a in args:
        if a.startswith("-"):
            name, eq, value = a.partition("=")
            if name in _PIP_VALUE_OPTIONS and not eq:
                value = next(args, "")
                assert value, f"{line.where}: {name} without its value"
            options[name] = value
        else:
            targets.append(a)
    assert targets, f"{line.where}: pip install of nothing: {line.text}"
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
                raise AssertionError(f"{line.where}: {target!r} is not a valid requirement ({e})") from None
            named = sorted(req.extras) if req.name.lower() == "fastqa" else []
            if req.name.lower() == "torch":
                pinned = any(s.operator in ("==", "===") for s in req.specifier)
                assert pinned or re.search(r"/whl/cpu/?$", index), (
                    f"{line.where}: {line.text}\n`pip install torch` without the CPU index "
                    "(--index-url https://download.pytorch.org/whl/cpu) or a version pin pulls the CUDA wheels")
        unknown = [e for e in named if e not in extras]
        assert not unknown, (f"{line.where}: extras {unknown} are not in pyproject.toml's "
                             f"[project.optional-dependencies] ({sorted(extras)})")


def check_make(line: ShLine) -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", makefile, flags=re.M))
    wanted = [a for a in line.argv[1:] if not a.startswith("-") and "=" not in a]
    unknown = [t for t in wanted if t not in targets]
    assert not unknown, f"{line.where}: {line.text}\nno such Makefile target: {unknown}"


def _last_line(text: str) -> str:
    """argparse's error line, without the usage block before it."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no message)"


def check_torchrun(line: ShLine) -> None:
    """``torchrun OPTIONS -m fastqa CMD ...``: torchrun's options by its own parser, the command by fastqa's."""
    from torch.distributed.run import get_args_parser

    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            args = get_args_parser().parse_args(line.argv[1:])
        except SystemExit:
            raise AssertionError(f"{line.where}: {line.text}\ntorchrun: {_last_line(err.getvalue())}") from None
    assert args.module and args.training_script == "fastqa", f"{line.where}: not `torchrun ... -m fastqa`"
    ns, error = _parse(args.training_script_args)
    assert ns is not None, f"{line.where}: {line.text}\n{error}"


def _script_commands(text: str) -> list[list[str]]:
    """The ``fastqa`` commands of a shell script (continuations joined, comments and VAR=value words left out,
    ``exec`` dropped, DOC_ENV's variables expanded)."""
    out = []
    for joined in re.sub(r"\\\n", " ", text).splitlines():
        code, _ = split_comment(joined)
        _, words = _command(shlex.split(code) if code.strip() else [])
        if words[:1] == ["exec"]:
            words = words[1:]
        if words[:1] == ["fastqa"]:
            out.append(words)
    return out


def check_script(line: ShLine, earlier: list[ShLine]) -> None:
    """``sh|bash SCRIPT ARGS``: the script's syntax, then what runs it: the GPU check's arguments by its own
    parser, a run-of-record script's fastqa commands by fastqa's, with its required variables exported by an
    ``earlier`` line."""
    shell, script, args = line.argv[0], line.argv[1], line.argv[2:]
    path = REPO / script
    assert path.is_file(), f"{line.where}: {line.text}\nno such script: {script}"
    r = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{line.where}: {shell} -n {script}: {r.stderr}"
    text = path.read_text(encoding="utf-8")
    if script == "scripts/gpu_check.sh":
        if "gpu_check" not in sys.modules:
            load_script(REPO / "scripts" / "gpu_check")
        parse_args = importlib.import_module("gpu_check.supervisor").parse_args
        assert args, f"{line.where}: scripts/gpu_check.sh needs OUT"
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                parse_args(["--out", args[0], *args[1:], "--device", "cpu"])
            except SystemExit:
                raise AssertionError(f"{line.where}: {line.text}\n{_last_line(err.getvalue())}") from None
        return
    commands = _script_commands(text)
    assert commands, f"the doc test does not know how to check {script} ({line.where}): teach tests/test_readme.py"
    for argv in commands:
        ns, error = _parse(argv[1:])
        assert ns is not None, f"{line.where}: {script}: {shlex.join(argv)}\n{error}"
    exported = {w.partition("=")[0] for ln in earlier if ln.argv[0] == "export" for w in ln.argv[1:]}
    required = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", text))
    assert required <= exported, f"{line.where}: {script} needs {sorted(required - exported)}, exported by no line above"


def check_gpu_script(line: ShLine) -> None:
    """``python scripts/gpu_NAME.py ARGS``: a script for a CUDA GPU; ARGS parsed by the script's own parse_args
    (its CPU dry run has its own test)."""
    script, args = line.argv[1], line.argv[2:]
    path = REPO / script
    assert path.is_file(), f"{line.where}: {line.text}\nno such script: {script}"
    assert re.fullmatch(r"scripts/gpu_\w+\.py", script), (
        f"the doc test does not know how to run: {line.text} ({line.where}); teach tests/test_readme.py")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            load_script(path).parse_args(args)
        except SystemExit:
            raise AssertionError(f"{line.where}: {line.text}\n{_last_line(err.getvalue())}") from None


def run_benchmarks(line: ShLine, tmp_path: Path) -> None:
    """``python -m benchmarks[.MODULE] ARGS``: with ``--list`` (the cases the filters select, at least one); the
    comparison of two results files on copies of a recorded one (no case slower: exit status 0)."""
    module, args = line.argv[2], line.argv[3:]
    if module == "benchmarks.compare":
        files = [a for a in args if a.endswith(".json")]
        for name in files:
            shutil.copy(RECORDED_BENCH, tmp_path / name)
    elif "--list" not in args:
        args = [*args, "--list"]
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, env=_env(line.env), capture_output=True,
                       text=True, errors="replace", timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{line.where}: {line.text}\nexit status {r.returncode}\n{_tail(r.stderr)}"
    if module == "benchmarks.compare":
        assert re.search(r"\n[1-9]\d* compared, 0 regression", r.stdout), r.stdout
    else:
        assert re.search(r"modes: ", r.stdout), f"{line.where}: {line.text}\nselects no case:\n{r.stdout}"


def run_pytest(line: ShLine) -> None:
    """``pytest ARGS``: with ``--collect-only``: the options exist and the tests load."""
    r = subprocess.run([sys.executable, "-m", "pytest", *line.argv[1:], "--collect-only", "-q", "-p", "no:cacheprovider"],
                       cwd=REPO, env=_env(line.env), capture_output=True, text=True, errors="replace",
                       timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and re.search(r"\d+ tests? collected", r.stdout), (
        f"{line.where}: {line.text}\nexit status {r.returncode}\n{_tail(r.stdout + r.stderr)}")


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
    check_torchrun(_line("torchrun --standalone --nproc_per_node 2 -m fastqa qa-train --train ... --dev ... --out r"))
    for bad, why in [("torchrun --gpus 2 -m fastqa info", "torchrun: .*unrecognized"),
                     ("torchrun --standalone -m fastqa qa-train --trian x --out r", "--trian"),
                     ("torchrun --standalone train.py", "-m fastqa")]:
        with pytest.raises(AssertionError, match=why):
            check_torchrun(_line(bad))
    train_sh = _line("sh docs/runs/qanet-small-v11-match/train.sh")
    with pytest.raises(AssertionError, match=r"needs \['GLOVE', 'SQUAD'\], exported by no line above"):
        check_script(train_sh, [])
    check_script(train_sh, [_line("export SQUAD=/s"), _line("export GLOVE=/g")])
    with pytest.raises(AssertionError, match="no such script"):
        check_script(_line("sh docs/runs/nothing/train.sh"), [])
    with pytest.raises(AssertionError, match="phase"):
        check_script(_line("bash scripts/gpu_check.sh out --phases b,z"), [])
    with pytest.raises(AssertionError, match="--sections"):
        check_gpu_script(_line("python3 scripts/gpu_bench_graphs.py --out o --sections qanet,nope"))
    assert _script_commands("set -eu\nOMP_NUM_THREADS=1 exec fastqa qa-train \\\n  --train \"$SQUAD/x.json\"  # a\n# fastqa no\n") \
        == [["fastqa", "qa-train", "--train", "data/squad/x.json"]]
    assert [_curl_port(_line(t)) for t in ("curl -s localhost:8000/answer -d {}", "curl http://127.0.0.1/health",
                                           "curl -s example.org:8000/answer")] == [8000, 80, None]
    ws = Workspace(tmp_path, [_line("fastqa qa-eval scores.csv pred.json")])
    assert "scores.csv" in ws.unmakeable and not (tmp_path / "pred.json").exists()
    with pytest.raises(AssertionError, match="cannot make: 'scores.csv'"):
        ws._run(0)


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory) -> dict[str, Workspace]:
    """One workspace per document, made when its first line runs."""
    return {}


def _workspace(workspaces: dict[str, Workspace], doc: str, tmp_path_factory) -> Workspace:
    if doc not in workspaces:
        root = tmp_path_factory.mktemp(Path(doc).stem)
        workspaces[doc] = Workspace(root, _SH_LINES[doc])
    return workspaces[doc]


_SH_LINES = {doc_name(path): doc_lines(path) for path in DOCS}
_CASES = [(doc, k) for doc, lines in _SH_LINES.items() for k in range(len(lines))]


@pytest.mark.parametrize("doc,k", _CASES, ids=[_id(_SH_LINES[doc][k]) for doc, k in _CASES])
def test_shell_line(doc, k, workspaces, tmp_path_factory, tmp_path):
    """One line of a ```sh block of the README or docs/: run, or checked for form where it cannot run here."""
    line = _SH_LINES[doc][k]
    argv = line.argv
    where = f"{line.where}: {line.text}"
    if argv[0] == "fastqa":
        ns, error = _parse(argv[1:])
        assert ns is not None, f"{where}\n{error}"
        if argv[1] == "download":
            return  # parsed only: the tests have no network
        outcome = _workspace(workspaces, doc, tmp_path_factory).outcome(k)
    elif argv[0] == "curl":
        outcome = _workspace(workspaces, doc, tmp_path_factory).outcome(k)
    elif argv[0] in ("pip", "pip3") or argv[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
        return check_pip(line)
    elif argv[0] in ("python", "python3") and argv[1:2] == ["-m"] and re.match(r"benchmarks(\.|$)", argv[2]):
        return run_benchmarks(line, tmp_path)
    elif argv[0] in ("python", "python3") and argv[1:2] and argv[1].startswith("scripts/"):
        return check_gpu_script(line)
    elif argv[0] == "pytest":
        return run_pytest(line)
    elif argv[0] == "torchrun":
        return check_torchrun(line)
    elif argv[0] in ("sh", "bash"):
        return check_script(line, _SH_LINES[doc][:k])
    elif argv[0] == "make":
        return check_make(line)
    elif argv[0] in ("cd", "export"):
        return  # parsed only (shlex)
    else:
        pytest.fail(f"the doc test does not know how to run: {line.text} ({line.where}); "
                    "teach tests/test_readme.py")
    if outcome.skip:
        pytest.skip(outcome.skip)
    assert outcome.ok, outcome.message
