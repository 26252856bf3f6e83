"""Evaluation metrics as pure functions: SQuAD EM/F1 with the official v1.1/v2.0 semantics
(:mod:`fastqa.metrics.squad`) and BLEU (:mod:`fastqa.metrics.bleu`)."""
