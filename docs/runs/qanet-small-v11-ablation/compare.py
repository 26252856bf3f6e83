"""Dev EM/F1 and dev loss of the v1.1 baseline run, its two ablations and the run with the exact-match channel,
step for step: a Markdown table on stdout and compare.png beside this file.

    python docs/runs/qanet-small-v11-ablation/compare.py

Reads ../qanet-small-v11/metrics.jsonl (the baseline), the ablations' metrics.jsonl copies kept here and
../qanet-small-v11-match/metrics.jsonl. Needs fastqa installed (for its metrics reader) and matplotlib."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from fastqa.data.metrics import read_metrics  # noqa: E402

RUNS = {
    "baseline (articles 0-39, dropout 0.1)": HERE.parent / "qanet-small-v11" / "metrics.jsonl",
    "articles 0-19": HERE / "metrics-20-articles.jsonl",
    "dropout 0.2 / char 0.1": HERE / "metrics-dropout-0.2.jsonl",
    "+ exact-match channel": HERE.parent / "qanet-small-v11-match" / "metrics.jsonl",
}


def evals(path: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(path) if r.get("kind") == "eval"}


def main() -> int:
    runs = {name: evals(path) for name, path in RUNS.items()}
    steps = sorted({s for e in runs.values() for s in e if s % 500 == 0})
    names = list(runs)
    print("| step | " + " | ".join(f"{n}: dev loss / EM / F1" for n in names) + " |")
    print("|---:|" + "---|" * len(names))
    for s in steps:
        cells = [f"{e[s]['dev_loss']:.2f} / {e[s]['EM']:.2f} / {e[s]['F1']:.2f}" if s in e else "–"
                 for e in runs.values()]
        print(f"| {s} | " + " | ".join(cells) + " |")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, e in runs.items():
        xs = sorted(e)
        axes[0].plot(xs, [e[s]["dev_loss"] for s in xs], "o-", label=name)
        axes[1].plot(xs, [e[s]["F1"] for s in xs], "o-", label=name)
    axes[0].set(xlabel="step", ylabel="dev loss (articles 40-47)")
    axes[1].set(xlabel="step", ylabel="dev F1 (articles 40-47)")
    axes[1].legend()
    fig.suptitle("QANet small, SQuAD v1.1 dev split by article: what limits dev F1, and what lifts it")
    fig.tight_layout()
    fig.savefig(HERE / "compare.png", dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
