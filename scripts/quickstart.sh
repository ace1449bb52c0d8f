#!/usr/bin/env bash
# The main job, end to end on one machine (CPU is enough):
#   raw text -> Beam pipeline (vocab, NSP pairs, masking) -> Arrow shards + held-out shards
#
# Settings (environment variables; defaults make a small run of a few minutes):
#   RUN_DIR      where everything goes                 (default: runs/quickstart)
#   CORPUS       input files/globs in Google's txt format; default: the Python
#                standard library's docstrings and reference, written offline
#   HELDOUT      held-out input files/globs            (default: 10% of the default corpus)
#   VOCAB_SIZE   learned WordPiece vocab size          (default: 8000)
#   DUPE_FACTOR  masking passes over the data          (default: 5)
#   MAX_SEQ      max_seq_length                        (default: 128)
#   WORKERS      Beam DirectRunner worker processes    (default: 2)
#   BEAM_ARGS    extra Beam options, e.g. "--runner=DataflowRunner --project=..."
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091
. "$root/scripts/setup.sh"
cd "$root"

run="${RUN_DIR:-runs/quickstart}"
vocab_size="${VOCAB_SIZE:-8000}"
dupe="${DUPE_FACTOR:-5}"
max_seq="${MAX_SEQ:-128}"
workers="${WORKERS:-2}"
read -r -a beam_args <<< "${BEAM_ARGS:-}"
runner=(--direct_num_workers="$workers" --direct_running_mode=multi_processing "${beam_args[@]}")
start=$(date +%s)

if [ -z "${CORPUS:-}" ]; then
  python -m pipeline.corpus --output "$run/corpus" --files 10
  corpus="$run/corpus/stdlib-docs-00[0-8].txt"
  heldout="${HELDOUT:-$run/corpus/stdlib-docs-009.txt}"
else
  corpus="$CORPUS"
  heldout="${HELDOUT:-}"
fi

echo "== 1. pipeline: $corpus -> $run/shards"
python -m pipeline build --input $corpus --output "$run/shards" --overwrite \
  --vocab_size "$vocab_size" --dupe_factor "$dupe" --max_seq_length "$max_seq" "${runner[@]}"
if [ -n "$heldout" ]; then
  echo "== 2. held-out shards: $heldout -> $run/heldout (same vocab)"
  python -m pipeline build --input $heldout --output "$run/heldout" --overwrite \
    --vocab_file "$run/shards/vocab.txt" --dupe_factor 1 --max_seq_length "$max_seq" "${runner[@]}"
fi
echo "== 3. statistics and plots"
python -m pipeline stats "$run/shards" --plot

echo
echo "== summary ($(( $(date +%s) - start )) s)"
echo "shards:     $run/shards ($(python -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['num_rows'], 'rows in', len(m['shards']), 'shards')" "$run/shards/manifest.json"))"
[ -n "$heldout" ] && echo "held-out:   $run/heldout"
echo "vocab:      $run/shards/vocab.txt"
echo "plots:      $run/shards/lengths.png $run/shards/masking.png"
