"""Deprecated aliases of ``fastqa.tasks`` (``fastqa.pipelines.qa``, ``fastqa.pipelines.translation``), kept
for one version."""
