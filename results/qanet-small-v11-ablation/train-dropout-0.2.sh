#!/usr/bin/env bash
# Regularisation ablation of results/qanet-small-v11: the same split (articles 0-39 / 40-47), model, recipe and
# seed, with twice the dropout (0.2 on words and sublayer outputs, 0.1 on characters). Compare dev EM/F1 step for
# step with ../qanet-small-v11/metrics.jsonl.
cd "$(dirname "$0")/../.."
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:40 \
  --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --set dropout=0.2 --set char_dropout=0.1 \
  --out runs/qanet-small-v11-dropout0.2 --max-minutes 62 --eval-every 500 --log-every 50 --threads 1 --no-progress
