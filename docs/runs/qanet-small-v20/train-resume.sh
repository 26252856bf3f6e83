#!/bin/sh
# Segment 2 of the run of train.sh: resume from step 592 for 80 more minutes, one CPU thread.
#   SQUAD: folder holding dev-v2.0.reconstructed.json.gz (the SQuAD v2.0 development set)
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v2.0.reconstructed.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
OMP_NUM_THREADS=1 exec fastqa qa-train \
  --train "$SQUAD/dev-v2.0.reconstructed.json.gz" --train-articles 0:30 \
  --dev "$SQUAD/dev-v2.0.reconstructed.json.gz" --dev-articles 30:35 \
  --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=false --out runs/qanet-small-v20 --max-minutes 80 \
  --eval-every 1000 --log-every 100 --threads 1 --device cpu --no-progress --resume
