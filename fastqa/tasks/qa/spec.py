"""The question-answering task as the package sees it (``fastqa.tasks.spec.TaskSpec``): its commands, its
predictor, the readers it loads, its shipped reader, its route of ``fastqa serve`` and its documented run."""
from __future__ import annotations

from ..spec import ReferenceRun, TaskSpec
from .readers import MODELS

__all__ = ["SPEC"]

SPEC = TaskSpec.in_folder(
    __package__,
    name="qa",
    predictor="fastqa.tasks.qa.predictor:QAModel",
    kinds=MODELS,
    shipped="qanet-small-squad",
    serve_flag="--qa-model",
    serve_help="a qa-train run folder, an export or a shipped model's name (with neither model flag: the shipped models)",
    reference_runs={
        # The QANet recipe of the README (articles 0:40): docs/models.md, "Real-data results", the run of record
        # docs/runs/qanet-small-v11-match (its best evaluation: EM 40.21 / F1 52.74 on articles 40-47 at step
        # 4,500, after 40 minutes on one AMD EPYC thread; F1 24.83 at step 500, 35.84 at step 1,000).
        ("qanet", "small"): ReferenceRun(
            result="F1 ~53 (EM 40) on SQuAD v1.1 dev articles 40-47", steps=4500, minutes=40,
            machine="one AMD EPYC thread", early="F1 ~25 after 500 steps and ~36 after 1,000"),
    },
)
