#!/bin/sh
# Segment 2 (session 8): resume the v2.0 run from step 592 for 80 more minutes, 1 thread.
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v2.0.reconstructed.json.gz --train-articles 0:30 \
  --dev /work/shared/data/squad/dev-v2.0.reconstructed.json.gz --dev-articles 30:35 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --out runs/qanet-small-v20 --max-minutes 80 --eval-every 1000 --log-every 100 --threads 1 --no-progress --resume
