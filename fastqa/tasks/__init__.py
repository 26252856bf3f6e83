"""The tasks fastqa trains and serves, one folder each, every folder of the same kinds of module:
its data, its metric, its training task for ``fastqa.train.fit``, its predictor and its command.

    fastqa/tasks/qa/            readers on SQuAD: ``QAModel``, ``fastqa qa-train | qa-predict | qa-eval | ask``
    fastqa/tasks/translation/   ConvS2S on parallel text: ``Translator``, ``fastqa mt-train | translate | mt-eval``

Adding a task is one folder of the same kinds of module and one line in ``TASKS``.
"""
from __future__ import annotations

#: The command module of each task; ``fastqa.cli`` registers their subcommands in this order.
TASKS = ("fastqa.tasks.qa.cli", "fastqa.tasks.translation.cli")

__all__ = ["TASKS"]
