"""SentencePiece subword models: training, encode/decode round trips, bytes, and agreement with Vocab."""
from __future__ import annotations

import copy
import pickle
import random

import pytest

pytest.importorskip("sentencepiece")

from fastqa.data.subword import SPECIALS, SubwordModel  # noqa: E402
from fastqa.data.vocab import EOS, PAD, SOS, UNK, Vocab  # noqa: E402

UNSEEN = "Ærøskøbing 東京 🙂"


def _corpus(n: int = 400, seed: int = 0) -> list[str]:
    """Cased German-looking sentences with punctuation, made up from a fixed seed."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyzäöüß"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(300)]
    lines = []
    for _ in range(n):
        ws = [rng.choice(words) for _ in range(rng.randint(3, 12))]
        ws = [w.capitalize() if rng.random() < 0.3 else w for w in ws]
        ws[0] = ws[0].capitalize()
        if rng.random() < 0.3:
            ws[rng.randrange(len(ws))] += ","
        lines.append(" ".join(ws) + rng.choice([".", "!", "?", " (ja)."]))
    return lines


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return _corpus()


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def model(request, corpus) -> SubwordModel:
    return SubwordModel.train(corpus, vocab_size=500, model_type=request.param)


def test_round_trip_on_training_and_new_text(model, corpus):
    for line in corpus[:50] + _corpus(50, seed=1):
        pieces = model.encode(line)
        assert model.decode(pieces) == line
        assert model.decode(model.encode_ids(line)) == line
    assert 300 < len(model) <= 500


def test_cased(model):
    text = "Zwei MÄNNER und eine Frau."
    assert model.decode(model.encode(text)) == text
    assert model.decode(model.encode(text.lower())) == text.lower()


def test_pieces_are_subwords(corpus):
    m = SubwordModel.train(corpus, vocab_size=600)
    lengths = [len(p.lstrip("▁")) for line in corpus for p in m.encode(line)]
    assert max(lengths) > 2, "expected multi-character pieces, got characters only"


def test_unseen_words_and_characters_never_unk(model):
    for text in (UNSEEN, "Ein Quokka sitzt in Ærøskøbing 東京 und lacht 🙂!", "naïve café – „Zitat“ ½"):
        ids = model.encode_ids(text)
        assert model.to_vocab().unk_id not in ids
        assert UNK not in model.encode(text)
        assert model.decode(ids) == text
    # the unseen characters are spelled with byte pieces
    assert any(model.is_byte(i) for i in model.encode_ids(UNSEEN))


def test_without_byte_fallback_unseen_characters_are_unk(corpus):
    m = SubwordModel.train(corpus, vocab_size=300, byte_fallback=False)
    ids = m.encode_ids(UNSEEN)
    assert m.to_vocab().unk_id in ids
    assert m.to_vocab().encode(m.encode(UNSEEN)) == ids
    assert not any(m.is_byte(i) for i in range(len(m)))
    # pieces keep the unseen characters (copied through); their ids cannot
    assert m.decode(m.encode(UNSEEN)) == UNSEEN
    assert "⁇" in m.decode(ids)


def test_deterministic(corpus):
    for model_type in ("unigram", "bpe"):
        a = SubwordModel.train(corpus, vocab_size=500, model_type=model_type)
        b = SubwordModel.train(iter(list(corpus)), vocab_size=500, model_type=model_type)
        assert a.to_bytes() == b.to_bytes()
        assert a.fingerprint() == b.fingerprint() and a == b


def test_bytes_round_trip(model, corpus):
    data = model.to_bytes()
    assert isinstance(data, bytes)
    back = SubwordModel.from_bytes(data)
    assert back == model and len(back) == len(model)
    assert SubwordModel.from_bytes(bytearray(data)) == model
    for line in corpus[:20] + [UNSEEN]:
        assert back.encode_ids(line) == model.encode_ids(line)
    assert pickle.loads(pickle.dumps(model)) == model
    assert copy.deepcopy(model).encode(UNSEEN) == model.encode(UNSEEN)


def test_vocab_ids_agree(model, corpus):
    vocab = model.to_vocab()
    assert isinstance(vocab, Vocab) and len(vocab) == len(model)
    assert vocab.itos[:4] == list(SPECIALS) == [PAD, UNK, SOS, EOS]
    assert (vocab.pad_id, vocab.unk_id, vocab.id_of(SOS), vocab.id_of(EOS)) == (0, 1, 2, 3)
    for line in corpus[:30] + [UNSEEN]:
        assert vocab.encode(model.encode(line)) == model.encode_ids(line)
        assert vocab.decode(model.encode_ids(line)) == model.encode(line)
    assert Vocab.from_dict(vocab.to_dict()) == vocab


def test_decode_drops_control_specials(model):
    text = "Ein Mann, der liest."
    ids = model.encode_ids(text)
    assert model.decode([2, *ids, 3, 0, 0]) == text
    assert model.decode([SOS, *model.encode(text), EOS, PAD]) == text
    assert model.decode([]) == ""
    # a model's output as a tensor of ids
    torch = pytest.importorskip("torch")
    assert model.decode(torch.tensor([2, *ids, 3])) == text


def test_tiny_corpus_with_large_vocab_size():
    m = SubwordModel.train(["Hallo Welt!", "Guten Tag."], vocab_size=8000)
    assert len(m) < 8000
    assert m.decode(m.encode("Hallo Tag!")) == "Hallo Tag!"
    assert m.decode(m.encode(UNSEEN)) == UNSEEN


def test_identity_normalization_keeps_characters(corpus):
    text = "Er sagt … „ﬁne“ mit ２ Hunden."
    kept = SubwordModel.train(corpus + [text], vocab_size=500)
    assert kept.decode(kept.encode(text)) == text
    folded = SubwordModel.train(corpus + [text], vocab_size=500, normalization="nmt_nfkc")
    assert folded.decode(folded.encode(text)) == "Er sagt ... „fine“ mit 2 Hunden."


def test_user_symbols_are_kept_whole(corpus):
    m = SubwordModel.train(corpus, vocab_size=500, user_symbols=["<de>", "<en>"])
    assert m.to_vocab().itos[4:6] == ["<de>", "<en>"]
    assert "<de>" in m.encode("<de> Ein Satz.")
    assert m.decode(m.encode("<de> Ein Satz.")) == "<de> Ein Satz."


def test_bad_arguments(corpus):
    with pytest.raises(TypeError, match="lines"):
        SubwordModel.train("just one string")
    with pytest.raises(TypeError, match=r"lines\[1\]"):
        SubwordModel.train(["ok", 3])
    with pytest.raises(ValueError, match="lines"):
        SubwordModel.train(["", "   "])
    with pytest.raises(ValueError, match="vocab_size"):
        SubwordModel.train(corpus, vocab_size=100)
    with pytest.raises(TypeError, match="vocab_size"):
        SubwordModel.train(corpus, vocab_size=8000.0)
    with pytest.raises(ValueError, match="model_type"):
        SubwordModel.train(corpus, model_type="char")
    with pytest.raises(ValueError, match="character_coverage"):
        SubwordModel.train(corpus, character_coverage=0)
    with pytest.raises(ValueError, match="normalization"):
        SubwordModel.train(corpus, normalization="nmt_nfkc_cf")
    with pytest.raises(ValueError, match="user_symbols"):
        SubwordModel.train(corpus, user_symbols=[EOS])
    with pytest.raises(ValueError, match="num_threads"):
        SubwordModel.train(corpus, num_threads=0)


def test_errors_from_the_callers_iterable_pass_through():
    def lines():
        yield "Hallo Welt."
        raise KeyError("broken reader")

    with pytest.raises(KeyError, match="broken reader"):
        SubwordModel.train(lines())


def test_bad_use(model):
    with pytest.raises(TypeError, match="text"):
        model.encode(b"bytes")
    with pytest.raises(TypeError, match="tokens"):
        model.decode("a string")
    with pytest.raises(ValueError, match=r"tokens\[1\]"):
        model.decode([5, len(model)])
    with pytest.raises(TypeError, match=r"tokens\[1\].*mix"):
        model.decode(["▁a", 5])
    with pytest.raises(TypeError, match=r"tokens\[0\]"):
        model.decode([1.5])
    with pytest.raises(TypeError, match="data"):
        SubwordModel.from_bytes("not bytes")
    with pytest.raises(ValueError, match="data"):
        SubwordModel.from_bytes(b"not a model")


def test_from_bytes_rejects_other_id_layouts(tmp_path):
    import io

    import sentencepiece as spm

    writer = io.BytesIO()
    # sentencepiece's own defaults: <unk> 0, <s> 1, </s> 2, no <pad>
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_corpus(50)), model_writer=writer, vocab_size=100,
                                   hard_vocab_limit=False, num_threads=1, minloglevel=2)
    with pytest.raises(ValueError, match="specials"):
        SubwordModel.from_bytes(writer.getvalue())
