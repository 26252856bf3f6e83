#!/bin/sh
# QANet small + the no-answer option on SQuAD v2.0, without the exact-match channel: train on
# dev-v2.0 articles 0:30, evaluate on 30:35, GloVe 6B 50d, one CPU thread. Segment 1 of 2 (train-resume.sh).
# --set word_match=false: the model of this run has no exact-match channel (today's small preset has it).
#   SQUAD: folder holding dev-v2.0.reconstructed.json.gz (the SQuAD v2.0 development set)
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v2.0.reconstructed.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
OMP_NUM_THREADS=1 exec fastqa qa-train \
  --train "$SQUAD/dev-v2.0.reconstructed.json.gz" --train-articles 0:30 \
  --dev "$SQUAD/dev-v2.0.reconstructed.json.gz" --dev-articles 30:35 \
  --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=false --out runs/qanet-small-v20 --max-minutes 40 \
  --eval-every 500 --log-every 50 --threads 1 --device cpu --no-progress
