"""The translation task as the package sees it (``fastqa.tasks.spec.TaskSpec``): its commands, its predictor,
the model kind it loads, its shipped translator, its route of ``fastqa serve`` and its documented run."""
from __future__ import annotations

from ..spec import ReferenceRun, TaskSpec

__all__ = ["SPEC"]

SPEC = TaskSpec.in_folder(
    __package__,
    name="translation",
    predictor="fastqa.tasks.translation.translator:Translator",
    kinds=("convs2s",),
    shipped="convs2s-small-multi30k",
    serve_flag="--mt-model",
    serve_help="an mt-train run folder, an export or a shipped model's name",
    reference_runs={
        # The shipped translator convs2s-small-multi30k: docs/models.md, "Real-data results" (the default subword
        # vocabulary, 88 min, 6,501 steps: sacreBLEU 40.07 on test_2016_flickr, beam 5); the machine from
        # docs/runs/convs2s-small-multi30k-subword/README.md. The early points: that run's metrics.jsonl,
        # --valid-bleu 200 (greedy tokenized BLEU 27.38 at step 500, 34.43 at step 1,000).
        ("convs2s", "small"): ReferenceRun(
            result="sacreBLEU ~40 on Multi30k de-en test_2016_flickr (beam 5, subword vocabulary)", steps=6501,
            minutes=88, machine="one Intel Xeon thread",
            early="--valid-bleu 200 reads BLEU ~27 after 500 steps and ~34 after 1,000"),
    },
)
