#!/bin/sh
# ConvS2S small on Multi30k de->en with the default joint cased SentencePiece vocabulary (8,000 pieces):
# 88 minutes on one CPU thread, then greedy and beam-5 translation of test_2016_flickr, scored with sacreBLEU's
# default (cased) signature and chrF. Writes runs/convs2s-small-multi30k-subword/ under the current folder.
#   MULTI30K: folder holding {train,val,test_2016_flickr}.{de,en}.gz
set -eu
: "${MULTI30K:?set MULTI30K to the folder holding train.de.gz, train.en.gz, val.de.gz, ...}"
RUN=runs/convs2s-small-multi30k-subword
OMP_NUM_THREADS=1 fastqa mt-train --src "$MULTI30K/train.de.gz" --tgt "$MULTI30K/train.en.gz" \
  --valid-src "$MULTI30K/val.de.gz" --valid-tgt "$MULTI30K/val.en.gz" --out "$RUN" \
  --preset small --vocab subword --vocab-size 8000 --batch-size 64 --optimizer adam --label-smoothing 0.1 \
  --eval-every 500 --valid-bleu 200 --epochs 1000 --max-minutes 88 --threads 1 --device cpu --no-progress
for beam in 1 5; do
  OMP_NUM_THREADS=1 fastqa mt-eval --model "$RUN" --src "$MULTI30K/test_2016_flickr.de.gz" \
    --ref "$MULTI30K/test_2016_flickr.en.gz" --beam "$beam" --threads 1 --device cpu \
    --output "test_beam$beam.txt" --json "test_beam$beam.json" > "test_beam$beam.score"
done
grep -c '<unk>' test_beam5.txt || true   # 0: a subword model never writes <unk>
