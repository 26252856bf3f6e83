#!/bin/sh
# Continue the real-data run (the first segment stopped after one epoch, 281 steps / 25 min, when --max-minutes
# alone still meant one epoch in the loop): resume exactly from its checkpoint for 45 more minutes.
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:40 \
  --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --out runs/qanet-small-v11 --max-minutes 45 --eval-every 500 --log-every 50 --threads 1 --no-progress --resume
