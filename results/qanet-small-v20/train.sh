#!/bin/sh
# SQuAD v2.0 real-data run (not a test): small preset + no-answer option, GloVe 6B 50d,
# dev-v2.0.reconstructed articles 0:30 -> 30:35, 40 minutes, 1 thread.
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v2.0.reconstructed.json.gz --train-articles 0:30 \
  --dev /work/shared/data/squad/dev-v2.0.reconstructed.json.gz --dev-articles 30:35 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --out runs/qanet-small-v20 --max-minutes 40 --eval-every 500 --log-every 50 --threads 1 --no-progress
