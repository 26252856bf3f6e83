#!/bin/sh
# Segment 2 of the run of train.sh: resume exactly from its checkpoint for 45 more minutes (steps 282-1024).
#   SQUAD: folder holding dev-v1.1.json.gz
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v1.1.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
OMP_NUM_THREADS=1 exec fastqa qa-train \
  --train "$SQUAD/dev-v1.1.json.gz" --train-articles 0:40 \
  --dev "$SQUAD/dev-v1.1.json.gz" --dev-articles 40:48 \
  --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=false --out runs/qanet-small-v11 --max-minutes 45 \
  --eval-every 500 --log-every 50 --threads 1 --device cpu --no-progress --resume
