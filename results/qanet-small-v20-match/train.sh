#!/bin/sh
# QANet small + the exact-match feature (--set word_match=true) + the no-answer option on SQuAD v2.0,
# otherwise as ../qanet-small-v20: dev-v2.0 articles 0:30 -> 30:35, GloVe 6B 50d, 75 minutes, 1 thread.
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v2.0.reconstructed.json.gz --train-articles 0:30 \
  --dev /work/shared/data/squad/dev-v2.0.reconstructed.json.gz --dev-articles 30:35 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --set word_match=true --out runs/qanet-small-v20-match --max-minutes 75 \
  --eval-every 500 --log-every 50 --threads 1 --no-progress
