"""Parallel text: reading (plain/gz), error messages, vocabularies with the model's special ids, batches."""
from __future__ import annotations

import gzip

import pytest

from fastqa.tasks.translation.parallel import (SPECIALS, ParallelData, build_vocabs, guess_lang, read_lines, read_parallel,
                                     tokenize_line, tokenize_lines)
from fastqa.errors import UserError


def _write(path, text: str, gz: bool = False):
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_read_lines_plain_gz_and_line_endings(tmp_path):
    text = "Ein Hund läuft.\r\n\nZwei Männer\n"
    plain = _write(tmp_path / "a.de", text)
    packed = _write(tmp_path / "a.de.gz", text, gz=True)
    assert read_lines(plain) == read_lines(packed) == ["Ein Hund läuft.", "", "Zwei Männer"]
    # No newline after the last line: the line still counts.
    assert read_lines(_write(tmp_path / "b.en", "one\ntwo")) == ["one", "two"]
    # \x0b and U+2028 inside a sentence do not split it (only \n ends a line).
    assert read_lines(_write(tmp_path / "c.en", "a\u2028b\x0bc\n")) == ["a\u2028b\x0bc"]


def test_read_lines_errors_name_the_file(tmp_path):
    with pytest.raises(UserError, match=r"empty\.en: the file is empty"):
        read_lines(_write(tmp_path / "empty.en", ""))
    with pytest.raises(UserError, match=r"empty\.en\.gz: the file is empty"):
        read_lines(_write(tmp_path / "empty.en.gz", "", gz=True))
    with pytest.raises(UserError, match=r"missing\.en: no such file"):
        read_lines(tmp_path / "missing.en")
    (tmp_path / "bad.en").write_bytes(b"fine\nalso fine\n\xff\xfe broken\n")
    with pytest.raises(UserError, match=r"bad\.en: line 3: not UTF-8"):
        read_lines(tmp_path / "bad.en")
    (tmp_path / "trunc.en.gz").write_bytes(gzip.compress(b"one\ntwo\n" * 100)[:-12])
    with pytest.raises(UserError, match=r"trunc\.en\.gz: cannot read"):
        read_lines(tmp_path / "trunc.en.gz")


def test_read_parallel_counts_must_match(tmp_path):
    src = _write(tmp_path / "x.de", "a\nb\nc\n")
    tgt = _write(tmp_path / "x.en.gz", "a\nb\n", gz=True)
    with pytest.raises(UserError) as e:
        read_parallel(src, tgt)
    msg = str(e.value)
    assert "x.de has 3 lines" in msg and "x.en.gz has 2" in msg
    assert read_parallel(src, _write(tmp_path / "y.en", "1\n2\n3\n")) == (["a", "b", "c"], ["1", "2", "3"])


def test_tokenize_and_vocab_ids():
    assert tokenize_line("Zwei Männer, die lachen.", "de") == ["zwei", "männer", ",", "die", "lachen", "."]
    assert tokenize_line("Two men  laugh.", "en", lowercase=False) == ["Two", "men", "laugh", "."]
    src = tokenize_lines(["ein hund .", "ein mann .", "ein kind"], "de")
    tgt = tokenize_lines(["a dog .", "a man .", "a child"], "en")
    sv, tv = build_vocabs(src, tgt, min_freq=2)
    for v in (sv, tv):
        assert v.itos[:4] == list(SPECIALS) == ["<pad>", "<unk>", "<sos>", "<eos>"]
        assert (v.pad_id, v.unk_id, v.id_of("<sos>"), v.id_of("<eos>")) == (0, 1, 2, 3)
    assert sv.itos[4:] == ["ein", "."] and tv.itos[4:] == ["a", "."]  # seen twice or more, most frequent first
    assert sv["hund"] == 1  # below min_freq -> <unk>


def test_parallel_data_layout_and_filtering():
    src = [["a", "b"], ["c"], [], ["a"] * 9]
    tgt = [["x"], ["y", "z", "x"], ["x"], ["x"]]
    sv, tv = build_vocabs(src, tgt, min_freq=1)
    data = ParallelData.from_tokens(src, tgt, sv, tv, max_len=6)
    assert len(data) == 2  # the pair with an empty side and the one longer than 6 (+<eos>) are dropped
    b = data.collate([0, 1])
    eos, sos = 3, 2
    assert b.src.tolist() == [[sv["a"], sv["b"], eos], [sv["c"], eos, 0]]
    assert b.tgt_in.tolist() == [[sos, tv["x"], 0, 0], [sos, tv["y"], tv["z"], tv["x"]]]
    assert b.tgt_out.tolist() == [[tv["x"], eos, 0, 0], [tv["y"], tv["z"], tv["x"], eos]]
    assert data.lengths() == [3, 4] and data.num_target_tokens() == 6
    # Without max_len nothing long is dropped (evaluation keeps every pair).
    assert len(ParallelData.from_tokens(src, tgt, sv, tv)) == 3
    batches = data.batches(1, seed=0, epoch=0)
    assert sorted(i for b in batches for i in b) == [0, 1] and batches == data.batches(1, seed=0, epoch=0)


def test_guess_lang():
    assert guess_lang("/d/train.de.gz", "--src-lang") == "de"
    assert guess_lang("val.EN", "--tgt-lang") == "en"
    with pytest.raises(UserError, match=r"corpus\.txt.*--src-lang"):
        guess_lang("corpus.txt", "--src-lang")
