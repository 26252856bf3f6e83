"""A POST body is read as JSON whatever its Content-Type says: ``curl -d '{...}'`` (which labels the body
``application/x-www-form-urlencoded``), no Content-Type at all, or text/plain get the answer a request labelled
application/json gets, and a body that is not JSON is still 400 malformed JSON whatever its label."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest


def _question(serve_models) -> dict:
    paragraph = serve_models["squad"]["data"][0]["paragraphs"][0]
    return {"context": paragraph["context"], "question": paragraph["qas"][0]["question"], "top_k": 2}


def _post(server, path: str, raw: bytes, content_type: str | None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(server.url + path, data=raw, method="POST")
    if content_type is not None:
        req.add_header("Content-Type", content_type)
    else:  # urllib labels a body a form unless told otherwise: send none at all
        req.remove_header("Content-type")
        req.unredirected_hdrs.pop("Content-type", None)
    opener = urllib.request.build_opener()
    try:
        with opener.open(req, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed here")
def test_curl_d_as_the_docs_write_it(server, serve_models):
    """The docs' ``curl -s URL/answer -d '{...}'``, run by curl itself: the answer, not 422."""
    body = _question(serve_models)
    want_status, want = server.post("/answer", body)
    assert want_status == 200, want
    r = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", server.url + "/answer", "-d", json.dumps(body)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    text, status = r.stdout.rsplit("\n", 1)
    assert status == "200", text
    assert json.loads(text) == want
    sentence = {"text": "ka lo mi", "beam": 2}
    want_status, want = server.post("/translate", sentence)
    r = subprocess.run(["curl", "-s", server.url + "/translate", "-d", json.dumps(sentence)], capture_output=True,
                       text=True, timeout=60)
    assert want_status == 200 and json.loads(r.stdout) == want, r.stdout


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain; charset=utf-8",
                                          "multipart/form-data; boundary=xyz", "application/json"])
def test_a_json_body_is_read_whatever_its_label(server, serve_models, content_type):
    body = _question(serve_models)
    want_status, want = server.post("/answer", body)
    status, got = _post(server, "/answer", json.dumps(body).encode("utf-8"), content_type)
    assert (status, got) == (want_status, want)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "application/json", None])
def test_a_body_that_is_not_json_is_still_refused(server, content_type):
    status, got = _post(server, "/answer", b"context=Ada+was+here&question=Who", content_type)
    assert status == 400 and got["status"] == 400 and re.match("malformed JSON", got["error"]), got
