#!/usr/bin/env bash
# Throughput of trainer/run.py with deploy/zero2.json on one GPU node: BERT-Base and
# BERT-Large, seq 128, synthetic shards, a few hundred steps each; prints sequences/s and
# MFU (median of the logged windows after the first). Runs in a few minutes on an A100/H100.
#
#   bash deploy/gpu_bench.sh                # all GPUs of this node
#   NUM_GPUS=1 STEPS=200 bash deploy/gpu_bench.sh
#
# The batch is one micro-batch per GPU per step (no accumulation), so each logged window
# measures the model step plus the trainer's overhead, not the optimizer's share of a
# 4096-row step. MFU uses the peak of the device table in trainer/metrics.py (bf16 dense).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
work="${WORK:-$(mktemp -d)}"
steps="${STEPS:-300}"
gpus="${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())')}"

python - "$work" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "bench")
from loader_speed import write_synthetic
out = Path(sys.argv[1], "shards")
if not (out / "manifest.json").exists():
    out.mkdir(parents=True, exist_ok=True)
    write_synthetic(out, rows=200_000, shards=4, seq=128, max_pred=20)
PY

for spec in "base 128" "large 64"; do
    set -- $spec
    preset=$1 micro=$2
    python - "$work" "$preset" "$micro" "$gpus" <<'PY'
import json, sys
work, preset, micro, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ds = json.load(open("deploy/zero2.json"))
ds.update(train_micro_batch_size_per_gpu=micro, train_batch_size=micro * gpus)
ds["scheduler"]["params"]["warmup_num_steps"] = 10
json.dump(ds, open(f"{work}/ds-{preset}.json", "w"))
PY
    rm -rf "$work/run-$preset"
    deepspeed --num_gpus "$gpus" trainer/run.py --ds-config "$work/ds-$preset.json" \
        --data "$work/shards" --model "$preset" --output-dir "$work/run-$preset" \
        --max-steps "$steps" --log-every 20 --save-every 0 --export-hf false \
        --num-workers 2 > "$work/run-$preset.log" 2>&1 || { tail -50 "$work/run-$preset.log"; exit 1; }
    python - "$work/run-$preset/metrics.jsonl" "$preset" "$micro" "$gpus" <<'PY'
import json, statistics, sys
rows = [json.loads(x) for x in open(sys.argv[1])][1:]
med = lambda k: statistics.median(r[k] for r in rows if r.get(k) is not None) if any(r.get(k) for r in rows) else None
print(json.dumps({"preset": sys.argv[2], "seq": 128, "micro": int(sys.argv[3]), "gpus": int(sys.argv[4]),
                  "sequences_per_s": round(med("sequences_per_s"), 1), "tokens_per_s": round(med("tokens_per_s")),
                  "mfu": med("mfu"), "final_loss": rows[-1]["loss"]}))
PY
done
