#!/bin/sh
# Data-size ablation of ../qanet-small-v11: the same model, recipe, seed and dev split, trained on half the
# articles (0-19 instead of 0-39). Compare dev EM/F1 step for step with ../qanet-small-v11/metrics.jsonl.
# --set word_match=false: the model of the baseline has no exact-match channel (today's small preset has it).
#   SQUAD: folder holding dev-v1.1.json.gz
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v1.1.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
OMP_NUM_THREADS=1 exec fastqa qa-train \
  --train "$SQUAD/dev-v1.1.json.gz" --train-articles 0:20 \
  --dev "$SQUAD/dev-v1.1.json.gz" --dev-articles 40:48 \
  --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=false --out runs/qanet-small-v11-20art --max-minutes 65 \
  --eval-every 500 --log-every 50 --threads 1 --device cpu --no-progress
