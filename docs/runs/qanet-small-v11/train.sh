#!/bin/sh
# QANet small without the exact-match channel on SQuAD v1.1: train on dev-v1.1 articles 0:40, evaluate on
# 40:48, GloVe 6B 50d, one CPU thread. First of three segments (train-resume.sh, train-resume2.sh continue it).
# --set word_match=false: the model of this run has no exact-match channel (today's small preset has it).
#   SQUAD: folder holding dev-v1.1.json.gz
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v1.1.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
OMP_NUM_THREADS=1 exec fastqa qa-train \
  --train "$SQUAD/dev-v1.1.json.gz" --train-articles 0:40 \
  --dev "$SQUAD/dev-v1.1.json.gz" --dev-articles 40:48 \
  --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=false --out runs/qanet-small-v11 --max-minutes 60 \
  --eval-every 500 --log-every 50 --threads 1 --device cpu --no-progress
