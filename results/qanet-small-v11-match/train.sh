#!/bin/sh
# QANet small + the exact-match feature (--set word_match=true), otherwise as ../qanet-small-v11/train.sh:
# GloVe 6B 50d, SQuAD v1.1 dev articles 0:40 -> 40:48, 90 minutes, 1 thread.
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:40 \
  --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --set word_match=true --out runs/qanet-small-v11-match --max-minutes 90 \
  --eval-every 500 --log-every 50 --threads 1 --no-progress
