#!/bin/sh
# Regularisation ablation of ../qanet-small-v11: the same split (articles 0-39 / 40-47), model, recipe and seed,
# with twice the dropout (0.2 on words and sublayer outputs, 0.1 on characters). Compare dev EM/F1 step for step
# with ../qanet-small-v11/metrics.jsonl.
# --set word_match=false: the model of the baseline has no exact-match channel (today's small preset has it).
#   SQUAD: folder holding dev-v1.1.json.gz
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v1.1.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
OMP_NUM_THREADS=1 exec fastqa qa-train \
  --train "$SQUAD/dev-v1.1.json.gz" --train-articles 0:40 \
  --dev "$SQUAD/dev-v1.1.json.gz" --dev-articles 40:48 \
  --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=false --set dropout=0.2 --set char_dropout=0.1 \
  --out runs/qanet-small-v11-dropout0.2 --max-minutes 62 \
  --eval-every 500 --log-every 50 --threads 1 --device cpu --no-progress
