"""Generated SQuAD-format files for the QA tests (no test reads the real data sets).

Paragraphs are built from facts with templated sentences, so every answer's character offset is known by
construction; names carry unicode (accents, CJK, emoji), and the text has odd whitespace (double spaces,
tabs, newlines, no-break and thin spaces). ``make_squad`` returns the JSON object and writes it when given
a path (``.gz`` paths are gzip-compressed).
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

PEOPLE = ["Zoë Ångström", "José Müller", "Ada Lovelace", "Łukasz Żółw", "Søren Kierkegaard", "Chloé Dubois",
          "Ivan Petrov", "Mei Ling", "Olúfẹ́mi Adé", "Björn Borg", "Renée Fleming", "Nguyễn Văn An",
          "Dvořák Antonín", "Aiko Tanaka", "Émile Zola", "Gustav Mahler", "Frida Kahlo", "Ngozi Okafor",
          "Piotr Nowak", "Yusuf İslam", "Elena Ruíz", "Hamid Karimi", "Ilse Weber", "Tomás Ó Briain"]
CITIES = ["São Paulo", "Zürich", "Kraków", "北京", "Reykjavík", "Montréal", "Malmö", "Düsseldorf", "Córdoba",
          "Tromsø", "Łódź", "Curaçao", "Göteborg", "Bogotá", "Nîmes", "Ålesund"]
INSTRUMENTS = ["cello", "violin", "oboe", "harp", "sitar", "bassoon", "ukulele", "theremin", "koto", "banjo"]
SPACES = [" ", " ", " ", "  ", "\u00a0", "\u2009", "\t", " \n "]


def _sentence_sep(rng: random.Random) -> str:
    return rng.choice(SPACES)


def make_paragraph(rng: random.Random, people: list[str], *, qid_prefix: str, impossible_from: list[str] = ()
                   ) -> dict:
    """One paragraph about ``people`` with answerable questions (offsets by construction) and, for each
    name in ``impossible_from``, an unanswerable question (v2.0)."""
    context = ""
    qas = []

    def add(text: str) -> int:
        nonlocal context
        start = len(context)
        context += text
        return start

    if rng.random() < 0.5:
        add(rng.choice(["Notes 🎻:", "Biographies —", "Introduction."]) + _sentence_sep(rng))
    instruments = rng.sample(INSTRUMENTS, len(people))  # distinct: "who played the X" has one answer
    for k, person in enumerate(people):
        city, year = rng.choice(CITIES), str(rng.randint(1801, 1999))
        instrument = instruments[k]
        add(f"{person} was born in")
        add(_sentence_sep(rng))
        city_at = add(city)
        add(" in ")
        year_at = add(year)
        add("." + _sentence_sep(rng) + "Later, ")
        person_at = add(person)
        add(" played the ")
        instr_at = add(instrument)
        add(" every evening." + _sentence_sep(rng))
        q = f"{qid_prefix}-{k}"
        qas.append({"id": f"{q}-city", "question": f"Where was {person} born?",
                    "answers": [{"text": city, "answer_start": city_at}]})
        qas.append({"id": f"{q}-year", "question": f"In which year was {person} born?",
                    "answers": [{"text": year, "answer_start": year_at},
                                {"text": f"{year}", "answer_start": year_at}]})
        qas.append({"id": f"{q}-instr", "question": f"What did {person.split()[0]} play?",
                    "answers": [{"text": instrument, "answer_start": instr_at}]})
        qas.append({"id": f"{q}-who", "question": f"Who played the {instrument} every evening?",
                    "answers": [{"text": person, "answer_start": person_at}]})
    for k, other in enumerate(impossible_from):
        qas.append({"id": f"{qid_prefix}-no{k}", "question": f"Where was {other} born?", "answers": [],
                    "is_impossible": True,
                    "plausible_answers": [{"text": people[0], "answer_start": context.index(people[0])}]})
    return {"context": context, "qas": qas}


def make_squad(path: str | Path | None = None, *, articles: int = 4, paragraphs: int = 6, people: int = 2,
               v2: bool = False, seed: int = 0) -> dict:
    """A SQuAD v1.1 (or v2.0) JSON object: ``articles`` × ``paragraphs`` paragraphs about ``people``
    people each (4 answerable questions per person; v2.0 adds one unanswerable question per paragraph).
    Question ids are unique; paragraphs of one article never share a person's questions' answers."""
    rng = random.Random(seed)
    data = []
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            names = rng.sample(PEOPLE, people + 1)
            in_text, absent = names[:people], names[people:]
            para = make_paragraph(rng, in_text, qid_prefix=f"s{seed}a{a}p{p}", impossible_from=absent if v2 else [])
            if v2:
                for qa in para["qas"]:
                    qa.setdefault("is_impossible", False)
            paras.append(para)
        data.append({"title": f"Article_{a}_ünïcode", "paragraphs": paras})
    obj = {"version": "v2.0" if v2 else "1.1", "data": data}
    if path is not None:
        write_json(path, obj)
    return obj


def write_json(path: str | Path, obj: dict) -> Path:
    path = Path(path)
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path.write_text(text, encoding="utf-8")
    return path
