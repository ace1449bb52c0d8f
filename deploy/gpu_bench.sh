#!/usr/bin/env bash
# Training throughput on one GPU node: sequences/s and MFU of trainer/run.py (bf16, ZeRO-2
# from deploy/zero2.json) for BERT-Base and BERT-Large at seq 128 and 512, each with the
# unpadded encoder (--unpad true, the default) and the padded reference path (--unpad
# false), then bench/model_speed.py's bare model steps (ours unpadded, ours padded,
# transformers) on Google-like rows and, at seq 128, on the main job's row lengths
# (--lengths docstrings: mean 73 of 128). Sized to finish in about 5-8 minutes on one
# H200 (an estimate: start-up and the final checkpoint dominate each short run).
#
#   bash deploy/gpu_bench.sh                              # all GPUs of this node
#   NUM_GPUS=1 STEPS=300 bash deploy/gpu_bench.sh
#   PRESETS=large SEQS=512 MICRO_LARGE_512=24 MODEL_SPEED=0 bash deploy/gpu_bench.sh
#
# Data: synthetic shards (bench/gpu_bench.py shards, i.e. bench/loader_speed.py's
# write_synthetic), Google-like lengths: 90% of rows full length, 10% a uniformly random
# shorter length (8 .. seq-1); 15% of tokens masked, up to 20 (seq 128) / 80 (seq 512).
# A batch is padded to its longest row (rounded up to 8), so nearly every batch is full
# width and padding is about 5% of the positions: the unpadded gain here is that of
# Google-like data, not of short-row corpora (bench/model_speed.py --lengths docstrings).
#
# Each run: one micro-batch per GPU per step (no accumulation), STEPS steps (default 150),
# a metrics record every LOG_EVERY steps (25); sequences/s, tokens/s (real tokens) and MFU
# are medians of the records after the first (which holds the start-up). MFU counts the
# FLOPs of real tokens only (trainer/metrics.py), so padded and unpadded runs are
# comparable; the peak is trainer/metrics.py's table of GPUs (H200: 989 TFLOP/s dense
# bf16) unless PEAK_TFLOPS is set. Micro batches (MICRO_BASE_128=128, MICRO_BASE_512=32,
# MICRO_LARGE_128=64, MICRO_LARGE_512=16; model_speed.py: MODEL_SPEED_BATCH_128=64,
# MODEL_SPEED_BATCH_512=16) fit 80-140 GB GPUs. TORCH_ADAM=1 (default) uses
# torch's AdamW instead of DeepSpeed's FusedAdam, whose CUDA extension compiles at first
# use (a minute, and nvcc); TORCH_ADAM=0 measures zero2.json's optimizer as is.
# Attention: training applies the presets' attention dropout (0.1), so on CUDA the unpadded
# runs take the jagged nested SDPA path; ATTENTION_DROPOUT=0 trains without it, which
# takes the varlen FlashAttention path (deploy/README.md, "Which attention path runs where").
#
# Output: one JSON line per run as it finishes, then a table (unpadded/padded = ratio of
# sequences/s). Everything, with each run's log and metrics.jsonl, is also written to
# $OUT/gpu_bench/ when OUT is set, else to $WORK/results/ (WORK: a temporary directory
# unless set; it holds the shards, reused when WORK is given again).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    . .venv/bin/activate
fi

work="${WORK:-$(mktemp -d)}"
if [[ -n "${OUT:-}" ]]; then res="$OUT/gpu_bench"; else res="$work/results"; fi
mkdir -p "$work" "$res"
steps="${STEPS:-150}"
log_every="${LOG_EVERY:-25}"
presets="${PRESETS:-base large}"
seqs="${SEQS:-128 512}"
rows="${ROWS:-16384}"
torch_adam=false
if [[ "${TORCH_ADAM:-1}" == 1 ]]; then torch_adam=true; fi
peak=()
if [[ -n "${PEAK_TFLOPS:-}" ]]; then peak=(--peak-tflops "$PEAK_TFLOPS"); fi

micro_for() {  # preset seq -> micro batch per GPU
    local var="MICRO_${1^^}_$2"
    case "$1 $2" in
        "base 128") echo "${!var:-128}" ;;
        "base 512") echo "${!var:-32}" ;;
        "large 128") echo "${!var:-64}" ;;
        "large 512") echo "${!var:-16}" ;;
        *) echo "${!var:?set $var: no default micro batch for $1 at seq $2}" ;;
    esac
}

run_one() {  # preset seq unpad: one trainer run, one JSON line
    local preset=$1 seq=$2 unpad=$3 micro name dir start
    micro="$(micro_for "$preset" "$seq")"
    name="$preset-$seq-unpad-$unpad"
    dir="$work/runs/$name"
    rm -rf "$dir"
    local model=$preset
    if [[ -n "${ATTENTION_DROPOUT:-}" ]]; then
        model="$work/model-$preset.json"
        python bench/gpu_bench.py model-config "$preset" "$model" \
            --attention-dropout "$ATTENTION_DROPOUT"
    fi
    python bench/gpu_bench.py ds-config deploy/zero2.json "$work/ds-$name.json" \
        --micro "$micro" --gpus "$gpus" --torch-adam "$torch_adam"
    local launch=(python trainer/run.py)
    if ((gpus > 1)); then launch=(deepspeed --num_gpus "$gpus" trainer/run.py); fi
    start=$SECONDS
    if ! "${launch[@]}" --ds-config "$work/ds-$name.json" --data "$work/shards-$seq" \
        --model "$model" --output-dir "$dir" --unpad "$unpad" --max-steps "$steps" \
        --log-every "$log_every" --save-every 0 --export-hf false --num-workers 2 \
        ${peak[@]+"${peak[@]}"} > "$res/$name.log" 2>&1; then
        echo "FAILED: $name (log: $res/$name.log)"
        tail -50 "$res/$name.log"
        if [[ -f "$dir/logs/train-rank0.log" ]]; then
            cp "$dir/logs/train-rank0.log" "$res/$name.rank0.log"
            echo "--- $dir/logs/train-rank0.log"
            tail -50 "$dir/logs/train-rank0.log"
        fi
        return 1
    fi
    cp "$dir/metrics.jsonl" "$res/$name.metrics.jsonl"
    cp "$dir/logs/train-rank0.log" "$res/$name.rank0.log"
    python bench/gpu_bench.py summarize "$dir/metrics.jsonl" --preset "$preset" --seq "$seq" \
        --unpad "$unpad" --micro "$micro" --gpus "$gpus" --wall-s $((SECONDS - start)) \
        | tee -a "$res/results.jsonl"
    rm -rf "$dir"  # the final checkpoint: GBs for BERT-Large
}

main() {
    python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else
        "no CUDA device: deploy/gpu_bench.sh needs a GPU node")'
    gpus="${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())')}"
    python -c 'import torch; print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")'
    # DeepSpeed first, on its own and bounded: a missing or hanging install fails here in
    # seconds, with its own message, instead of inside the first run's log.
    if ! timeout "${IMPORT_TIMEOUT:-300}" python -c \
        'import deepspeed; print(f"deepspeed {deepspeed.__version__}")'; then
        echo "deepspeed does not import within ${IMPORT_TIMEOUT:-300} s: pip install -e '.[train]'"
        return 1
    fi
    echo "gpus $gpus, steps $steps, log every $log_every, attention dropout" \
        "${ATTENTION_DROPOUT:-of the preset}, work $work, results $res"
    : > "$res/results.jsonl"
    for seq in $seqs; do
        python bench/gpu_bench.py shards "$work/shards-$seq" --seq "$seq" --rows "$rows"
    done
    for preset in $presets; do
        for seq in $seqs; do
            for unpad in true false; do
                run_one "$preset" "$seq" "$unpad"
            done
        done
    done
    python bench/gpu_bench.py table "$res/results.jsonl" | tee "$res/table.txt"
    if [[ "${MODEL_SPEED:-1}" == 1 ]]; then
        # Bare model steps (no DeepSpeed, no data loader): ours unpadded, ours padded and
        # transformers on the same Google-like batch; one --batch per seq.
        for seq in $seqs; do
            batch_var="MODEL_SPEED_BATCH_$seq" batch=16
            if ((seq <= 128)); then batch=64; fi
            # shellcheck disable=SC2086
            python bench/model_speed.py --device cuda --dtype bf16 --preset $presets \
                --seq "$seq" --batch "${!batch_var:-$batch}" --lengths google --steps 10 \
                --no-memory ${peak[@]+"${peak[@]}"}
            if ((seq <= 128)); then  # short rows: the main job's length distribution
                # shellcheck disable=SC2086
                python bench/model_speed.py --device cuda --dtype bf16 --preset $presets \
                    --seq "$seq" --batch "${!batch_var:-$batch}" --lengths docstrings \
                    --steps 10 --no-memory ${peak[@]+"${peak[@]}"}
            fi
        done 2>&1 | tee "$res/model_speed.log"
    fi
    echo "done in $SECONDS s; results in $res"
}

main 2>&1 | tee "$res/gpu_bench.log"
