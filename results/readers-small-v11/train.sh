#!/bin/sh
# The three recurrent baselines on the QANet v1.1 split (articles 0:40 -> 40:48), GloVe 50d, small preset,
# 45 minutes each on one thread, from a frozen snapshot of the code (worktree /work/wt-runs at d32e77e).
# usage: sh baselines-v11.sh MODEL [MODEL ...]
cd /work/wt-runs
for model in "$@"; do
  OMP_NUM_THREADS=1 /work/main/.venv/bin/python -m fastqa.cli qa-train --model "$model" \
    --train /work/shared/data/squad/dev-v1.1.json.gz --train-articles 0:40 \
    --dev /work/shared/data/squad/dev-v1.1.json.gz --dev-articles 40:48 \
    --vectors /work/shared/data/glove/glove.6B.50d.top100k.txt.gz \
    --preset small --out /work/main/runs/$model-small-v11 --max-minutes 45 --eval-every 500 --log-every 50 \
    --threads 1 --no-progress > /work/main/runs/$model-small-v11.log 2>&1
done
