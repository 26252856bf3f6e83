#!/bin/sh
# Session 16: the recipe of ../qanet-small-v11-match/train.sh (90 minutes, one thread) on the current kernels,
# the VM's other core otherwise idle.
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:40 \
  --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --set word_match=true --out runs/qanet-small-v11-match-s16 --max-minutes 90 \
  --eval-every 500 --log-every 50 --threads 1 --no-progress
# then:
#   OMP_NUM_THREADS=1 .venv/bin/python -m fastqa.cli qa-predict --model runs/qanet-small-v11-match-s16 \
#     --data /work/shared/data/squad/dev-v1.1.json.gz --articles 40:48 --out runs/qanet-small-v11-match-s16/pred-40-48.json --threads 1
#   .venv/bin/python -m fastqa.cli qa-eval /work/shared/data/squad/dev-v1.1.json.gz \
#     runs/qanet-small-v11-match-s16/pred-40-48.json --articles 40:48 > eval-40-48.json
#   (the same two with --articles 0:40 give eval-0-40-train.json)
