#!/bin/sh
# Session 15's check after the CQA aux change (S̿ᵀc saved) and the dwsep kernels: as ../qanet-small-v11-match/train.sh with a 16-minute budget.
cd /work/main
OMP_NUM_THREADS=1 exec .venv/bin/python -m fastqa.cli qa-train \
  --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:40 \
  --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
  --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
  --preset small --set word_match=true --out runs/qanet-small-v11-match-s15 --max-minutes 16 \
  --eval-every 500 --log-every 50 --threads 1 --no-progress
# then:
#   .venv/bin/python -m fastqa.cli qa-predict --model runs/qanet-small-v11-match-s15 \
#     --data /work/shared/data/squad/dev-v1.1.json.gz --articles 40:48 --out runs/qanet-small-v11-match-s15/pred-40-48.json
#   .venv/bin/python -m fastqa.cli qa-eval /work/shared/data/squad/dev-v1.1.json.gz \
#     runs/qanet-small-v11-match-s15/pred-40-48.json --articles 40:48 > eval-40-48.json
