#!/bin/sh
# Segment 3: resume from step 1024 on the idle machine for 85 more minutes (session 7).
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:40 \
  --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --out runs/qanet-small-v11 --max-minutes 85 --eval-every 500 --log-every 50 --threads 1 --no-progress --resume
