#!/usr/bin/env bash
# The main job, end to end on one machine (CPU is enough):
#   raw text -> Beam pipeline (vocab, NSP pairs, masking) -> Arrow shards + held-out shards
#   -> DeepSpeed training (deepspeed launcher) -> held-out MLM/NSP accuracy
#   -> Hugging Face export -> plots -> summary
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
#   PRESET       model size: tiny mini small medium base large, or a config.json (default: mini)
#   MAX_STEPS    optimizer steps                        (default: 1500, ~6 min on 2 CPU cores)
#   DS_CONFIG    DeepSpeed JSON                         (default: deploy/cpu.json)
#   RANKS        training processes (default: GPUs present, else 2 CPU ranks)
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
echo "== 3. data statistics and plots"
python -m pipeline stats "$run/shards" --plot --plot-dir "$run/plots"

preset="${PRESET:-mini}"
steps="${MAX_STEPS:-1500}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ranks="${RANKS:-$(nvidia-smi -L | wc -l)}"
else
  ranks="${RANKS:-2}"
  export DS_ACCELERATOR=cpu
fi
eval_args=()
[ -n "$heldout" ] && eval_args=(--eval-data "$run/heldout" --eval-every 500)
echo "== 4. training: $preset, $steps steps, $ranks rank(s), ${DS_CONFIG:-deploy/cpu.json}"
rm -rf "$run/train"
deepspeed --num_gpus "$ranks" trainer/run.py --ds-config "${DS_CONFIG:-deploy/cpu.json}" \
  --data "$run/shards" "${eval_args[@]}" --model "$preset" --output-dir "$run/train" \
  --max-steps "$steps" --log-every 50 --save-every 500

echo
echo "== summary ($(( $(date +%s) - start )) s)"
python - "$run" <<'PY'
import json, sys
from pathlib import Path

run = Path(sys.argv[1])
manifest = json.loads((run / "shards" / "manifest.json").read_text())
records = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines() if line.strip()]
train = [r for r in records if r.get("split") != "eval"]
evals = [r for r in records if r.get("split") == "eval"]
speed = train[len(train) // 2 :]  # past the warm-up
print(f"shards:      {run / 'shards'} ({manifest['num_rows']} rows, {len(manifest['shards'])} shard(s), vocab {manifest['vocab']['size']})")
if (run / "heldout").exists():
    print(f"held-out:    {run / 'heldout'}")
print(f"checkpoints: {run / 'train' / 'checkpoints'}")
print(f"HF export:   {run / 'train' / 'hf'}")
print(f"plots:       {run / 'plots'} (data), {run / 'train' / 'plots'} (training)")
print(f"throughput:  {sum(r['sequences_per_s'] for r in speed) / len(speed):.1f} sequences/s, "
      f"{sum(r['tokens_per_s'] for r in speed) / len(speed):.0f} real tokens/s")
last = train[-1]
print(f"train (step {last['step']}): loss {last['loss']:.3f}, MLM accuracy {last['mlm_accuracy']:.3f}, NSP accuracy {last['nsp_accuracy']:.3f}")
if evals:
    e = evals[-1]
    print(f"held-out (step {e['step']}): MLM accuracy {e['mlm_accuracy']:.3f}, NSP accuracy {e['nsp_accuracy']:.3f}")
PY
