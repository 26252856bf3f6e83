#!/usr/bin/env bash
# Data-size ablation of results/qanet-small-v11: the same model, recipe, seed and dev split, trained on half
# the articles (0-19 instead of 0-39). Compare dev EM/F1 step for step with ../qanet-small-v11/metrics.jsonl.
cd "$(dirname "$0")/../.."
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:20 \
  --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --out runs/qanet-small-v11-20art --max-minutes 65 --eval-every 500 --log-every 50 --threads 1 --no-progress
