#!/bin/sh
# The three recurrent baselines on the split of ../qanet-small-v11 (dev-v1.1 articles 0:40 -> 40:48), GloVe 6B
# 50d, small preset, 45 minutes each on one CPU thread. Writes runs/MODEL-small-v11/ and runs/MODEL-small-v11.log.
# usage: sh train.sh MODEL [MODEL ...]     (MODEL: lstm, lstm-attention, lstm-pointer)
#   SQUAD: folder holding dev-v1.1.json.gz
#   GLOVE: folder holding glove.6B.50d.top100k.txt.gz (the 100,000 most frequent words of GloVe 6B 50d)
set -eu
: "${SQUAD:?set SQUAD to the folder holding dev-v1.1.json.gz}"
: "${GLOVE:?set GLOVE to the folder holding glove.6B.50d.top100k.txt.gz}"
mkdir -p runs
for model in "$@"; do
  OMP_NUM_THREADS=1 fastqa qa-train --model "$model" \
    --train "$SQUAD/dev-v1.1.json.gz" --train-articles 0:40 \
    --dev "$SQUAD/dev-v1.1.json.gz" --dev-articles 40:48 \
    --vectors "$GLOVE/glove.6B.50d.top100k.txt.gz" \
    --preset small --out "runs/$model-small-v11" --max-minutes 45 --eval-every 500 --log-every 50 \
    --threads 1 --device cpu --no-progress > "runs/$model-small-v11.log" 2>&1
done
