"""Generated parallel text for the translation tests: a copy task (the target line is the source line), which a
tiny ConvS2S learns in a few seconds; and the tiny model's flags."""
from __future__ import annotations

import random
from pathlib import Path

TINY_CONVS2S = ["--set", "embed_dim=32", "--set", "hidden_dim=64", "--set", "encoder_layers=2",
                "--set", "decoder_layers=2", "--set", "dropout=0"]


def sentences(words: list[str], n: int, seed: int) -> list[str]:
    """n lines of 3-8 words drawn from ``words``."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) for _ in range(n)]


def write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    return str(path)


def copy_corpus(folder: Path, words: list[str]) -> dict:
    """train/val/test .de and .en files of the copy task in ``folder`` (2,000 / 60 / 100 lines)."""
    train, valid, test = sentences(words, 2000, 0), sentences(words, 60, 1), sentences(words, 100, 2)
    files = {"dir": folder, "test": test}
    for split, lines in (("train", train), ("val", valid), ("test", test)):
        for lang in ("de", "en"):
            files[f"{split}.{lang}"] = write_lines(folder / f"{split}.{lang}", lines)
    return files
