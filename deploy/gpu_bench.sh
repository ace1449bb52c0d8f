#!/usr/bin/env bash
# The GPU check of the trainer, in stages, each bounded by its own time limit and each writing
# its result the moment it ends (one JSON line in $RES/stages.jsonl), so a stage that hangs
# costs its limit, not the run:
#
#   import       torch sees the GPU, DeepSpeed and the trainer import (no op is compiled)
#   overhead     bench/step_overhead.py for each of PRESETS at seq 128 with the trainer's micro
#                batch: the trainer's step (deploy/gpu.json on the torch engine, zero2.json and
#                zero3.json on DeepSpeed's) beside the bare
#                model step on the same batches: aten ops a step, host reads by call site,
#                the syncs CUDA reports (set_sync_debug_mode "warn") and both arms' sequences/s
#   smoke        tiny: steps with a checkpoint, a resume to twice as many, the HF export
#                (fp32 weights, loaded by transformers)
#   correctness  tiny, dropout off, CHECK_STEPS steps (50) logged each step: fp32 padded on
#                the GPU against the same run on this node's CPU (relative loss difference
#                <= 2e-3: fp32 reductions in another order, compounding over the updates),
#                and bf16 unpadded against bf16 padded (<= 3e-2: bf16 keeps 8 bits of
#                mantissa, 0.4% per rounding)
#   speed        sequences/s and MFU of trainer/run.py (bf16, DS_BASE: deploy/gpu.json, the
#                torch engine; DS_BASE=deploy/zero2.json measures DeepSpeed's ZeRO-2)
#                for each of PRESETS (base large) x SEQS (128; 512 too if time allows), with
#                the unpadded encoder (--unpad true) and the padded reference path (--unpad
#                false, the trainer's default on CUDA: deploy/README.md), then
#                bench/model_speed.py's bare model steps (ours unpadded, ours padded,
#                transformers) on Google-like rows and, at seq 128, on
#                the main job's row lengths (--lengths docstrings: mean 73 of 128)
#   profile      (opt-in: name it in STAGES) bench/gpu_profile.py on each of PRESETS at seq
#                128, with the trainer's micro batch: forward/backward/optimizer times, host
#                syncs per step and the top kernels, unpadded (PROFILE_PADDED=1: padded too)
#   compiled     the speed stage's trainer runs with --compile model (trainer/compiling.py)
#                for each of PRESETS at COMPILE_SEQS (128), unpadded and padded
#                (COMPILE_UNPADS), beside the eager rows in the same table; the first step's
#                time (compiling included) and the graphs compiled are in each result line
#
# Sized to fit 10 minutes on one H200 without the compiled stage, start-up included (limits:
# IMPORT_LIMIT 300, OVERHEAD_LIMIT 180, SMOKE_LIMIT 240, CHECK_LIMIT 300, SPEED_LIMIT 420,
# PROFILE_LIMIT 180, COMPILE_LIMIT 420 s;
# STAGES="import compiled" runs the compiled rows alone). A failed stage is recorded and the
# next one runs (speed does not need correctness); the exit code is 1 if any stage failed.
#
#   bash deploy/gpu_bench.sh                              # all GPUs of this node
#   NUM_GPUS=1 STEPS=300 bash deploy/gpu_bench.sh
#   STAGES="import speed" PRESETS=large SEQS=512 MICRO_LARGE_512=24 MODEL_SPEED=0 bash deploy/gpu_bench.sh
#   DEVICE=cpu bash deploy/gpu_bench.sh                   # every stage on CPU, tiny, a few steps
#
# DEVICE=cpu (CI: tests/trainer/test_deploy.py) runs every stage on this machine's CPU with the
# `tiny` preset, a few steps and small batches, so that a broken stage is found here and not
# on a GPU node (its correctness stage has no device to set against the CPU: it compares
# bf16 unpadded with padded only).
# An offline GPU node: install the wheels of deploy/wheelhouse.sh first (deploy/README.md).
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
# Output: one JSON line per stage and per speed run as it finishes, then the stages and a
# table (unpadded/padded = ratio of sequences/s). Everything, with each run's log and
# metrics.jsonl, is written to $OUT/gpu_bench/ when OUT is set, else to $WORK/results/ (WORK:
# a temporary directory unless set; it holds the shards, reused when WORK is given again).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
    # shellcheck disable=SC1091
    . .venv/bin/activate
fi
export PYTHONUNBUFFERED=1
export DEVICE="${DEVICE:-cuda}"
if [[ "$DEVICE" == cpu ]]; then
    export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=""
    # Every stage on tiny, a few steps: what the CPU mode checks is that each stage works.
    : "${PRESETS:=tiny}" "${STEPS:=6}" "${LOG_EVERY:=2}" "${ROWS:=512}" "${MICRO_TINY_128:=8}"
    : "${SMOKE_STEPS:=4}" "${CHECK_STEPS:=6}" "${MODEL_SPEED_BATCH_128:=2}"
    : "${COMPILE_UNPADS:=true}"  # one compiled run: that the stage works
    # What only this script checks is that each stage runs and records its results: the
    # padded path's speed run is left out (correctness runs it), and the compiled stage's
    # run goes through --compile model with torch.compile off (TORCH_COMPILE_DISABLE: its
    # 1-2 minutes of inductor on CPU are tests/trainer/test_compile.py's, and
    # test_deploy.py's long tier compiles here with COMPILE_ON_CPU=1).
    : "${SPEED_UNPADS:=true}" "${COMPILE_ON_CPU:=0}"
    export MICRO_TINY_128 MODEL_SPEED_BATCH_128
fi
export WORK="${WORK:-$(mktemp -d)}"
if [[ -n "${OUT:-}" ]]; then RES="$OUT/gpu_bench"; else RES="$WORK/results"; fi
export RES
mkdir -p "$WORK" "$RES"
export STEPS="${STEPS:-150}" LOG_EVERY="${LOG_EVERY:-25}" PRESETS="${PRESETS:-base large}"
export SEQS="${SEQS:-128}" ROWS="${ROWS:-16384}" SMOKE_STEPS="${SMOKE_STEPS:-10}"
export CHECK_STEPS="${CHECK_STEPS:-50}"
export TORCH_ADAM="${TORCH_ADAM:-1}"
export DS_BASE="${DS_BASE:-deploy/gpu.json}"  # the speed, smoke and correctness runs' recipe
export COMPILE_SEQS="${COMPILE_SEQS:-128}" COMPILE_UNPADS="${COMPILE_UNPADS:-true false}"

torch_adam() { if [[ "$TORCH_ADAM" == 1 ]]; then echo true; else echo false; fi; }
peak() { if [[ -n "${PEAK_TFLOPS:-}" ]]; then echo --peak-tflops "$PEAK_TFLOPS"; fi; }
gpus() {
    if [[ "$DEVICE" == cpu ]]; then echo "${NUM_GPUS:-1}"; return; fi
    echo "${NUM_GPUS:-$(python -c 'import torch; print(torch.cuda.device_count())')}"
}

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

train() {  # name ds.json shards model [trainer flags...]: one trainer run, its log in $RES
    local name=$1 ds=$2 data=$3 model=$4 n launch=(python trainer/run.py)
    shift 4
    n="$(gpus)"
    if ((n > 1)); then launch=(deepspeed --num_gpus "$n" trainer/run.py); fi
    if ! "${launch[@]}" --ds-config "$ds" --data "$data" --model "$model" \
        --output-dir "$WORK/runs/$name" --num-workers 2 "$@" >> "$RES/$name.log" 2>&1; then
        echo "FAILED: $name (log: $RES/$name.log)"
        tail -40 "$RES/$name.log"
        return 1
    fi
}

shards() {  # seq [rows] -> the directory of synthetic shards (written once per seq and rows)
    local dir="$WORK/shards-$1-${2:-$ROWS}"
    python bench/gpu_bench.py shards "$dir" --seq "$1" --rows "${2:-$ROWS}" >&2
    echo "$dir"
}

ds_json() {  # name micro precision -> a DeepSpeed JSON for one run
    python bench/gpu_bench.py ds-config "$DS_BASE" "$WORK/ds-$1.json" --micro "$2" \
        --gpus "$(gpus)" --torch-adam "$(torch_adam)" --precision "$3"
    echo "$WORK/ds-$1.json"
}

cache_listing() {  # dir -> a digest of the files under it; that of nothing if it is absent
    if [[ -d "$1" ]]; then find "$1" -maxdepth 3 | sort | md5sum; else echo absent; fi
}

stage_import() {
    python -c 'import torch, os, sys
cuda = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA {cuda}" + (f", {torch.cuda.get_device_name()}" if cuda else ""))
sys.exit(0 if cuda or os.environ["DEVICE"] == "cpu" else "no CUDA device: deploy/gpu_bench.sh needs a GPU node (DEVICE=cpu runs it on the CPU)")'
    python -c 'from importlib.metadata import version; print("deepspeed", version("deepspeed"))'
    # The trainer's own imports, DeepSpeed's included, must build no op (a GPU node may have
    # no compiler): the torch extensions cache is the same before and after.
    # A fresh node has no cache directory at all: that lists as empty, not as a failure
    # (under pipefail a bare `find` of a missing directory failed the stage).
    local cache="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}" before after
    before="$(cache_listing "$cache")"
    python -c 'import deepspeed, trainer.loop, trainer.run, model; print("trainer imports")'
    after="$(cache_listing "$cache")"
    [[ "$before" == "$after" ]] || { echo "importing the trainer built an op in $cache"; return 1; }
}

stage_overhead() {
    overhead_runs 2>&1 | tee -a "$RES/overhead.log"
}

overhead_runs() {  # one JSON line per preset and DeepSpeed config, into overhead.jsonl
    local failed=0 preset adam=()
    if [[ "$TORCH_ADAM" == 1 ]]; then adam=(--torch-adam); fi
    if [[ "$DEVICE" == cpu ]]; then
        # The micro-BERT: on CPU the stage checks that the bench runs.
        python bench/step_overhead.py --steps 2 --count-steps 1 \
            --ds-config deploy/gpu.json deploy/zero2.json "${adam[@]}" | grep "^{" | tee -a "$RES/overhead.jsonl" || failed=1
        return $failed
    fi
    for preset in $PRESETS; do
        python bench/step_overhead.py --preset "$preset" --batch "$(micro_for "$preset" 128)" \
            --ds-config deploy/gpu.json deploy/zero2.json deploy/zero3.json --steps 20 \
            --count-steps 1 \
            "${adam[@]}" | grep "^{" | tee -a "$RES/overhead.jsonl" || failed=1
    done
    return $failed
}

stage_smoke() {
    local data ds half=$SMOKE_STEPS
    data="$(shards 128 512)"
    ds="$(ds_json smoke 8 bf16)"
    train smoke "$ds" "$data" tiny --max-steps "$half" --save-every "$half" --log-every 1 \
        --export-hf false
    train smoke "$ds" "$data" tiny --max-steps $((2 * half)) --save-every "$half" \
        --log-every 1 --resume auto --export-hf true
    grep -q "resumed from" "$WORK/runs/smoke/logs/train-rank0.log"
    python -c 'import sys, torch
from transformers import BertForPreTraining
model = BertForPreTraining.from_pretrained(sys.argv[1])
dtypes = {p.dtype for p in model.parameters()}
assert dtypes == {torch.float32}, dtypes
print(f"export: {sys.argv[1]} loads in transformers, fp32")' "$WORK/runs/smoke/hf"
}

stage_correctness() {
    local data steps=$CHECK_STEPS flags
    data="$(shards 128 512)"
    flags=(--max-steps "$steps" --log-every 1 --save-every 0 --export-hf false --dropout 0)
    export NUM_GPUS=1  # one GPU against one CPU process
    train fp32-padded "$(ds_json fp32 8 fp32)" "$data" tiny --unpad false "${flags[@]}"
    train bf16-unpadded "$(ds_json bf16 8 bf16)" "$data" tiny --unpad true "${flags[@]}"
    train bf16-padded "$WORK/ds-bf16.json" "$data" tiny --unpad false "${flags[@]}"
    local ok=0
    if [[ "$DEVICE" != cpu ]]; then  # on CPU there is no device to set against the CPU
        DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES="" \
            train fp32-padded-cpu "$WORK/ds-fp32.json" "$data" tiny --unpad false "${flags[@]}"
        python bench/gpu_bench.py compare "$WORK/runs/fp32-padded/metrics.jsonl" \
            "$WORK/runs/fp32-padded-cpu/metrics.jsonl" --tolerance 2e-3 \
            --what "fp32 padded: $DEVICE vs cpu" | tee -a "$RES/correctness.jsonl" || ok=1
    fi
    python bench/gpu_bench.py compare "$WORK/runs/bf16-unpadded/metrics.jsonl" \
        "$WORK/runs/bf16-padded/metrics.jsonl" --tolerance 3e-2 \
        --what "bf16: unpadded vs padded on $DEVICE" | tee -a "$RES/correctness.jsonl" || ok=1
    return $ok
}

speed_run() {  # preset seq unpad [compile]: one trainer run, one JSON line
    local preset=$1 seq=$2 unpad=$3 compile=${4:-off} micro name start model=$1 data
    micro="$(micro_for "$preset" "$seq")"
    name="$preset-$seq-unpad-$unpad"
    [[ "$compile" == off ]] || name="$name-compile-$compile"
    if [[ -n "${ATTENTION_DROPOUT:-}" ]]; then
        model="$WORK/model-$preset.json"
        python bench/gpu_bench.py model-config "$preset" "$model" \
            --attention-dropout "$ATTENTION_DROPOUT"
    fi
    data="$(shards "$seq")"
    start=$SECONDS
    # shellcheck disable=SC2046
    train "$name" "$(ds_json "$name" "$micro" bf16)" "$data" "$model" --unpad "$unpad" \
        --max-steps "$STEPS" --log-every "$LOG_EVERY" --save-every 0 --export-hf false \
        --compile "$compile" --compile-cache "$WORK/compile-cache" $(peak) || return 1
    cp "$WORK/runs/$name/metrics.jsonl" "$RES/$name.metrics.jsonl"
    python bench/gpu_bench.py summarize "$WORK/runs/$name/metrics.jsonl" --preset "$preset" \
        --seq "$seq" --unpad "$unpad" --micro "$micro" --gpus "$(gpus)" \
        --wall-s $((SECONDS - start)) --compile "$compile" | tee -a "$RES/results.jsonl"
    rm -rf "$WORK/runs/$name"  # its checkpoint: GBs for BERT-Large
}

stage_speed() {
    local failed=0 preset seq unpad
    for preset in $PRESETS; do
        for seq in $SEQS; do
            for unpad in ${SPEED_UNPADS:-true false}; do
                speed_run "$preset" "$seq" "$unpad" || failed=1
            done
        done
    done
    python bench/gpu_bench.py table "$RES/results.jsonl" | tee "$RES/table.txt"
    if [[ "${MODEL_SPEED:-1}" == 1 ]]; then
        # A loop piped to tee runs in a subshell: its failures come back as the function's
        # status (pipefail), not through a variable set inside it.
        model_speed_runs 2>&1 | tee "$RES/model_speed.log" || failed=1
    fi
    return $failed
}

model_speed_runs() {  # bare model steps (no DeepSpeed, no data loader): ours unpadded, ours
    # padded and transformers on the same Google-like batch; one --batch per seq
    local failed=0 seq lengths dev=cuda model_steps=10
    [[ "$DEVICE" == cpu ]] && dev=cpu model_steps=2
    for seq in $SEQS; do
        local batch_var="MODEL_SPEED_BATCH_$seq" batch=16
        if ((seq <= 128)); then batch=64; fi
        for lengths in google docstrings; do
            if [[ $lengths == docstrings ]] && ((seq > 128)); then continue; fi
            # shellcheck disable=SC2046,SC2086
            python bench/model_speed.py --device "$dev" --dtype bf16 --preset $PRESETS \
                --seq "$seq" --batch "${!batch_var:-$batch}" --lengths "$lengths" \
                --steps "$model_steps" --no-memory $(peak) || failed=1
        done
    done
    return $failed
}

stage_profile() {
    profile_runs 2>&1 | tee -a "$RES/profile.log"
}

profile_runs() {
    local failed=0 preset path flags paths=(unpadded) dev=cuda
    [[ "${PROFILE_PADDED:-0}" == 1 ]] && paths+=(padded)
    [[ "$DEVICE" == cpu ]] && dev=cpu
    for preset in $PRESETS; do
        for path in "${paths[@]}"; do
            flags=()
            [[ $path == padded ]] && flags=(--padded)
            [[ "$DEVICE" == cpu ]] && flags+=(--warmup 1 --steps 2 --profile-steps 1)
            python bench/gpu_profile.py --device "$dev" --dtype bf16 --preset "$preset" \
                --seq 128 --batch "$(micro_for "$preset" 128)" "${flags[@]}" \
                --json "$RES/profile.jsonl" || failed=1
        done
    done
    return $failed
}

stage_compiled() {
    local failed=0 preset seq unpad
    if [[ "$DEVICE" == cpu && "${COMPILE_ON_CPU:-0}" != 1 ]]; then
        export TORCH_COMPILE_DISABLE=1
    fi
    for preset in $PRESETS; do
        for seq in $COMPILE_SEQS; do
            for unpad in $COMPILE_UNPADS; do
                speed_run "$preset" "$seq" "$unpad" model || failed=1
            done
        done
    done
    python bench/gpu_bench.py table "$RES/results.jsonl" | tee "$RES/table.txt"
    return $failed
}

if [[ "${1:-}" == --stage ]]; then  # one stage, in its own process (main's timeout)
    "stage_$2"
    exit
fi

run_stage() {  # name limit_s: the stage under its time limit; one JSON line when it ends
    local name=$1 limit=$2 start=$SECONDS rc=0
    echo "== $name (limit $limit s)"
    timeout --kill-after=15 "$limit" bash "${BASH_SOURCE[0]}" --stage "$name" || rc=$?
    local ok=false
    ((rc == 0)) && ok=true
    printf '{"stage": "%s", "ok": %s, "exit_code": %d, "seconds": %d, "limit_s": %d}\n' \
        "$name" "$ok" "$rc" $((SECONDS - start)) "$limit" | tee -a "$RES/stages.jsonl"
    return $rc
}

main() {
    echo "device $DEVICE, gpus $(gpus), presets $PRESETS, seqs $SEQS, work $WORK, results $RES"
    : > "$RES/stages.jsonl"
    : > "$RES/results.jsonl"
    : > "$RES/overhead.jsonl"
    local failed=0 name
    declare -A limit=([import]="${IMPORT_LIMIT:-300}" [overhead]="${OVERHEAD_LIMIT:-180}"
                      [smoke]="${SMOKE_LIMIT:-240}"
                      [correctness]="${CHECK_LIMIT:-300}" [speed]="${SPEED_LIMIT:-420}"
                      [profile]="${PROFILE_LIMIT:-180}" [compiled]="${COMPILE_LIMIT:-420}")
    for name in ${STAGES:-import overhead smoke correctness speed compiled}; do
        run_stage "$name" "${limit[$name]}" || failed=1
        if [[ "$name" == import && "$failed" == 1 ]]; then break; fi  # nothing else can run
    done
    echo "== stages"
    cat "$RES/stages.jsonl"
    echo "done in $SECONDS s; results in $RES"
    return $failed
}

main 2>&1 | tee "$RES/gpu_bench.log"
exit "${PIPESTATUS[0]}"
