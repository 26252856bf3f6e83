"""The declared bounds (``fastqa.bounds``) in the Python API and the server, on the two tiny models the serve
tests train: every bounded count of ``QAModel.answer`` / ``answer_many`` / ``predict_file``,
``Translator.translate`` and the loaders refuses absurd values (1e9, 1e23, 10**23, negative, NaN, infinity, a
float where an int is needed) with one ValueError or TypeError naming the argument, the value and the bound;
the server answers them with a 422 naming the field; and work that cannot fit in the free memory is refused in
one line, by the API and by the command."""
from __future__ import annotations

import math
import re

import pytest
from cli_helpers import run_cli

from fastqa import bounds
from fastqa.bounds import BOUNDS
from fastqa.errors import UserError

ABSURD = [10**9, 10**23, -1, -(10**23), 2.5, 1e9, 1e23, -1e23, math.nan, math.inf, -math.inf, True, "3"]


def _refused(call, name: str, value) -> None:
    """``call()`` raises a TypeError or ValueError naming ``name``, ``value`` and the bound, in one line."""
    b = BOUNDS[name]
    wrong_type = isinstance(value, (bool, str)) or (b.integer and isinstance(value, float))
    with pytest.raises(TypeError if wrong_type else ValueError) as e:
        call()
    message = str(e.value)
    assert message.startswith(f"{name} must be {b.expected} (got ") and "\n" not in message, message
    number = float(value)
    shown = f"{value!r}, a {type(value).__name__}" if wrong_type else (
        str(int(value)) if b.integer or (number.is_integer() and abs(number) < 1e15) else str(number))
    assert f"(got {shown})" in message, message


def _out_of_bound(name: str, value) -> bool:
    b = BOUNDS[name]
    try:
        b.check(value)
    except (TypeError, ValueError):
        return True
    return False


@pytest.fixture(scope="module")
def qa(serve_models):
    from fastqa.tasks.qa import QAModel

    return QAModel.load(serve_models["qa"], device="cpu")


@pytest.fixture(scope="module")
def translator(serve_models):
    from fastqa.tasks.translation import Translator

    return Translator.load(serve_models["mt"], device="cpu")


@pytest.fixture(scope="module")
def paragraph(serve_models) -> tuple[str, str]:
    para = serve_models["squad"]["data"][0]["paragraphs"][0]
    return para["context"], para["qas"][0]["question"]


@pytest.mark.parametrize("name", ["top_k", "batch_size", "max_answer_len", "max_context", "stride"])
def test_every_count_of_answer_is_bounded(qa, paragraph, name):
    context, question = paragraph
    for value in [*ABSURD, BOUNDS[name].high + 1]:
        if _out_of_bound(name, value):
            _refused(lambda: qa.answer(context, question, **{name: value}), name, value)
            _refused(lambda: qa.answer_many([context], [question], **{name: value}), name, value)
    # the highest value allowed answers (a window past the context is the whole context)
    found = qa.answer(context, question, **{name: BOUNDS[name].high if name != "stride" else 0})
    for answer in found if isinstance(found, list) else [found]:
        assert context[answer.start:answer.end] == answer.text


def test_top_k_at_its_bound_lists_distinct_answers(qa, paragraph):
    found = qa.answer(*paragraph, top_k=BOUNDS["top_k"].high)
    assert 1 <= len(found) <= BOUNDS["top_k"].high
    assert len({(a.start, a.end) for a in found}) == len(found)


@pytest.mark.parametrize("name", ["batch_size", "max_context", "stride"])
def test_every_count_of_predict_file_is_bounded(qa, serve_models, name):
    path = serve_models["root"] / "train.json"
    for value in (10**23, -1, 2.5, math.nan):
        _refused(lambda: qa.predict_file(path, progress=False, **{name: value}), name, value)


@pytest.mark.parametrize("name", ["beam", "nbest", "batch_size", "max_len_a", "max_len_b", "len_penalty"])
def test_every_count_of_translate_is_bounded(translator, name):
    for value in [*ABSURD, BOUNDS[name].high + 1]:
        if _out_of_bound(name, value):
            _refused(lambda: translator.translate(["ka lo mi"], **{name: value}), name, value)


def test_translate_at_the_bounds(translator):
    (best,) = translator.translate(["ka lo mi"], beam=BOUNDS["beam"].high, nbest=BOUNDS["nbest"].high,
                                   max_len_a=BOUNDS["max_len_a"].high, max_len_b=BOUNDS["max_len_b"].high)
    assert len(best.alternatives) == BOUNDS["nbest"].high - 1  # the model's positions cap the length


@pytest.mark.parametrize("value", [10**9, 0, 2.5, math.nan])
def test_the_loaders_bound_their_threads(serve_models, value):
    from fastqa.tasks.qa import QAModel
    from fastqa.tasks.translation import Translator

    _refused(lambda: QAModel.load(serve_models["qa"], threads=value), "threads", value)
    _refused(lambda: Translator.load(serve_models["mt"], threads=value), "threads", value)


# ------------------------------------------------------------------------------ the server

def _assert_422(status: int, body, field: str, pattern: str) -> None:
    assert status == 422 and body["status"] == 422 and body.get("field") == field, (status, body)
    assert re.search(pattern, body["error"]), body["error"]


@pytest.mark.parametrize("raw,pattern", [
    ("1000000000", "less than or equal to 20"),
    ("99999999999999999999999", "less than or equal to 20"),
    ("-99999999999999999999999", "greater than or equal to 1"),
    ("1e23", "valid integer"),
    ("1e9", "valid integer"),
    ("NaN", "valid integer"),
    ("Infinity", "valid integer"),
])
def test_the_server_refuses_an_absurd_top_k_and_max_answer_len(server, raw, pattern):
    for field in ("top_k", "max_answer_len"):
        body = f'{{"context": "Ada was born in Paris.", "question": "Where?", "{field}": {raw}}}'.encode()
        status, answer = server.request("POST", "/answer", raw=body)[:2]
        high = BOUNDS[field].high
        low = BOUNDS[field].low
        want = pattern.replace("20", str(high)).replace("equal to 1", f"equal to {low}")
        _assert_422(status, answer, field, want)


@pytest.mark.parametrize("raw,pattern", [
    ("100000", "less than or equal to 16"),
    ("99999999999999999999999", "less than or equal to 16"),
    ("-1", "greater than or equal to 1"),
    ("1e23", "valid integer"),
    ("NaN", "valid integer"),
])
def test_the_server_refuses_an_absurd_beam_and_nbest(server, raw, pattern):
    for field in ("beam", "nbest"):
        extra = ', "beam": 16' if field == "nbest" else ""
        body = f'{{"text": "ka lo", "{field}": {raw}{extra}}}'.encode()
        status, answer = server.request("POST", "/translate", raw=body)[:2]
        _assert_422(status, answer, field, pattern)


def test_the_server_takes_the_bounds_highest_values(server):
    status, body = server.post("/answer", {"context": "Ada was born in Paris in 1815.", "question": "Where?",
                                           "top_k": BOUNDS["top_k"].high,
                                           "max_answer_len": BOUNDS["max_answer_len"].high})
    assert status == 200 and 1 <= len(body["answers"]) <= BOUNDS["top_k"].high, body
    status, body = server.post("/translate", {"text": "ka lo", "beam": BOUNDS["beam"].high,
                                              "nbest": BOUNDS["nbest"].high})
    assert status == 200 and len(body["translations"][0]["alternatives"]) == BOUNDS["nbest"].high - 1, body
    status, health = server.get("/health")
    assert (health["limits"]["max_top_k"], health["limits"]["max_beam"]) == (BOUNDS["top_k"].high,
                                                                            BOUNDS["beam"].high)


# ------------------------------------------------------------------------------ memory

@pytest.fixture
def little_free_memory(monkeypatch):
    """The machine as one with 1 KiB free: what ``check_fits`` reads (psutil or /proc/meminfo) says so."""
    monkeypatch.setattr(bounds, "available_memory", lambda: 1 << 10)


def test_a_search_that_cannot_fit_is_refused_before_it_starts(translator, little_free_memory):
    with pytest.raises(UserError, match=r"^translating 1 sentences of up to \d+ tokens with beam 16 \(batch_size "
                                        r"64\) needs about .* of memory and 1\.0 KiB is free: lower the beam"):
        translator.translate(["ka lo mi nu po"], beam=16)


def test_a_reading_that_cannot_fit_is_refused_before_it_starts(qa, paragraph, little_free_memory):
    with pytest.raises(UserError, match=r"^reading \d+ windows of \d+ tokens at once .* needs about .* and 1\.0 KiB "
                                        r"is free: lower batch_size"):
        qa.answer(*paragraph, max_context=BOUNDS["max_context"].high)


def test_a_file_whose_reading_cannot_fit_is_refused_before_it_starts(qa, serve_models, little_free_memory):
    with pytest.raises(UserError, match=r"^reading \d+ windows of \d+ tokens at once \(batch_size 32, .* is free"):
        qa.predict_file(serve_models["root"] / "train.json", progress=False)


def test_the_commands_refuse_it_in_one_line(serve_models, capsys, tmp_path, little_free_memory):
    src = tmp_path / "src.txt"
    src.write_text("ka lo mi\n", encoding="utf-8")
    rc, out, err = run_cli(capsys, ["translate", "--model", serve_models["mt"], "--input", src, "--beam", "16",
                                    "--threads", "1"])
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("fastqa: error: translating 1 sentences") and "1.0 KiB is free" in err
    context, question = "Ada was born in Paris.", "Where?"
    rc, out, err = run_cli(capsys, ["ask", "--model", serve_models["qa"], "--context", context, "--question",
                                    question, "--max-context", "2048"])
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("fastqa: error: reading "), err


def test_the_same_work_runs_when_the_memory_is_there(translator, qa, paragraph):
    # The estimate refuses only what does not fit: on this machine the calls above answer.
    assert translator.translate(["ka lo mi nu po"], beam=16)[0].tokens is not None
    assert qa.answer(*paragraph, max_context=BOUNDS["max_context"].high).end >= 0


def test_the_server_refuses_a_number_of_thousands_of_digits(server):
    # More digits than Python converts: a client error (the body cannot be read as JSON numbers), never a 500.
    for path, body in (("/answer", '{"context": "Ada was born.", "question": "Who?", "top_k": %s}'),
                       ("/translate", '{"text": "ka lo", "beam": %s}')):
        status, answer = server.request("POST", path, raw=(body % ("9" * 5000)).encode())[:2]
        assert status in (400, 422) and answer["status"] == status and "\n" not in answer["error"], (status, answer)
