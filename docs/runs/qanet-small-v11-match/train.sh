#!/bin/sh
# QANet small + the exact-match channel on SQuAD v1.1: train on dev-v1.1 articles 0:40, evaluate on 40:48,
# GloVe 6B 50d, 90 minutes on one CPU thread. Writes runs/qanet-small-v11-match/ under the current folder.
#   SQUAD: folder holding dev-v1.1.json.gz
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v1.1.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
OMP_NUM_THREADS=1 exec fastqa qa-train \
  --train "$SQUAD/dev-v1.1.json.gz" --train-articles 0:40 \
  --dev "$SQUAD/dev-v1.1.json.gz" --dev-articles 40:48 \
  --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=true --out runs/qanet-small-v11-match --max-minutes 90 \
  --eval-every 500 --log-every 50 --threads 1 --device cpu --no-progress
# then:
#   OMP_NUM_THREADS=1 fastqa qa-predict --model runs/qanet-small-v11-match --data "$SQUAD/dev-v1.1.json.gz" \
#     --articles 40:48 --out runs/qanet-small-v11-match/pred-40-48.json --threads 1 --device cpu
#   fastqa qa-eval "$SQUAD/dev-v1.1.json.gz" runs/qanet-small-v11-match/pred-40-48.json --articles 40:48 > eval-40-48.json
#   (the same two with --articles 0:40 give eval-0-40-train.json)
