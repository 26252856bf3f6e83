#!/bin/sh
# The shipped reader qanet-small-squad: QANet small + the exact-match channel on SQuAD v1.1, trained on dev-v1.1
# articles 0:36 (36:40 held out for the calibration, 40:48 for evaluation), 60 minutes on one CPU thread; then
# the Platt calibration of its scores on 36:40, the float16 export, and the evaluation on 40:48 with the
# expected calibration error and the reliability diagram. Writes runs/qanet-small-squad/ under the current folder.
#   SQUAD: folder holding dev-v1.1.json.gz; GLOVE: folder holding glove.6B.50d.top100k.txt.gz (fastqa download)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v1.1.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
RUN=runs/qanet-small-squad
OMP_NUM_THREADS=1 fastqa qa-train --train "$SQUAD/dev-v1.1.json.gz" --train-articles 0:36 \
  --dev "$SQUAD/dev-v1.1.json.gz" --dev-articles 36:40 --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
  --preset small --set word_match=true --out "$RUN" --max-minutes 60 \
  --eval-every 500 --log-every 50 --threads 1 --device cpu --no-progress
fastqa qa-calibrate --model "$RUN" --data "$SQUAD/dev-v1.1.json.gz" --articles 36:40 \
  --plot reliability-36-39-fit.png --threads 2 --device cpu --no-progress
fastqa export "$RUN" qanet-small-squad --half
fastqa qa-predict --model qanet-small-squad --data "$SQUAD/dev-v1.1.json.gz" --articles 40:48 --out pred.json \
  --scores-out scores.json --threads 2 --device cpu --no-progress
fastqa qa-eval "$SQUAD/dev-v1.1.json.gz" pred.json --articles 40:48 --scores scores.json \
  --calibration reliability-40-47.png > eval-40-48.json
