#!/usr/bin/env bash
# The main job, end to end on one machine (CPU is enough):
#   raw text -> Beam pipeline (vocab, NSP pairs, masking) -> Arrow shards + held-out shards
#   -> DeepSpeed training (deepspeed launcher) -> held-out MLM/NSP accuracy
#   -> Hugging Face export -> plots -> summary, within a deadline (TOTAL_MINUTES)
#
# Settings (environment variables; defaults make a small run of a few minutes):
#   RUN_DIR      where everything goes                 (default: runs/quickstart)
#   CORPUS       input files/globs in Google's txt format; default: written offline from
#                the Python standard library's docstrings and reference, and with
#                CORPUS_PACKAGES the installed packages' docs (pipeline/cli/corpus.py)
#   HELDOUT      held-out input files/globs (default: the stdlib's stdlib-docs-009.txt, 10%
#                of its part, evaluated during training)
#   HELDOUT2     a second held-out set, evaluated after training (default with
#                CORPUS_PACKAGES: 1% of the packages' documents, packages-heldout.txt;
#                "" for none)
#   CORPUS_SOURCES  stdlib parts of the default corpus (default: "docstrings reference",
#                1.8 MB; also "test-docstrings comments": 2.7 MB)
#   CORPUS_PACKAGES packages whose prose joins it, a .py file's docstrings and comments one
#                document (default: "default", pipeline/cli/package_docs.py's PACKAGES, 21.6 MB,
#                with a second held-out set; "": the stdlib alone, 1.8 MB, which the model
#                memorises within the budget: use DUPE_FACTOR=5 there)
#   VOCAB_SIZE   learned WordPiece vocab size          (default: 8000)
#   DUPE_FACTOR  masking passes over the data          (default: 2: the budget sees each row
#                of the default corpus about once)
#   MAX_SEQ      max_seq_length                        (default: 128)
#   WORKERS      Beam DirectRunner worker processes    (default: 2)
#   BEAM_ARGS    extra Beam options, e.g. "--runner=DataflowRunner --project=..."
#   PRESET       model size: tiny mini small medium base large, or a config.json (default: tiny)
#   DROPOUT      hidden and attention dropout of a PRESET (default: 0, right for short runs)
#   TOTAL_MINUTES  the whole run's deadline, counted from the script's start, setup included
#                (default: 15): training's time budget is what the stages before it left,
#                less an estimate of the stages after it (scripts/deadline.sh)
#   TRAIN_MINUTES  training's time budget instead, deadline or not (the script says when it
#                will miss it); the learning-rate schedule decays over the budget (default:
#                unset: what TOTAL_MINUTES leaves)
#   MAX_STEPS    optimizer steps instead, for a run reproducible step for step (default: unset)
#   DS_CONFIG    DeepSpeed JSON                         (default: deploy/cpu.json)
#   PRECISION    fp32, bf16 or auto (bf16 on a CPU with AVX512-BF16/AMX or a GPU with bf16),
#                overriding DS_CONFIG's (default: unset, DS_CONFIG decides: fp32 for cpu.json;
#                on tiny, bf16 measured 1.1-1.2x faster on CPU, so fp32 stays the default)
#   MASKING      static (the shards' masks) or dynamic (re-masked by the trainer each epoch,
#                RoBERTa-style) (default: unset, the trainer's default: static)
#   OBJECTIVE    nsp: Google's recipe, sentence pairs with static masks; mlm: MLM-only rows
#                of packed sentences, unmasked, masked by the trainer (RoBERTa's, MosaicBERT's
#                and ModernBERT's data; DUPE_FACTOR does not apply) (default: nsp)
#   MASK_RATE    the trainer's dynamic masking rate, e.g. 0.3 (default: unset: 0.15, or the
#                shards' rate); held-out MLM rows are evaluated at 15% whatever it is
#   COMPILE      off, model or step: torch.compile for training (trainer/compiling.py), its
#                compile time inside the training budget (default: unset: off)
#   RANKS        training processes (default: GPUs present, else 2 CPU ranks)
#   MASTER_PORT  the ranks' rendezvous port (default: one free on this machine, so that two
#                quickstarts, or a quickstart beside other training, can run at once)
#   VERBOSE      1: every stage's full output on the console too (default: one line per stage)
#
# Console: one line per stage ("[2/6] pipeline ... done in 80 s"), live on a terminal with
# the stage's latest progress line; each stage's full output (BERT_VERBOSE=1: Beam's and
# DeepSpeed's logs included) goes to RUN_DIR/logs/STAGE.log, whose end is shown on failure.
# Each stage's time goes to RUN_DIR/stages.jsonl, which the summary prints against the
# deadline.
set -euo pipefail
started=$(date +%s.%3N)  # the deadline counts from here
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
total_minutes="${TOTAL_MINUTES:-15}"
for setting in "TOTAL_MINUTES=$total_minutes" ${TRAIN_MINUTES:+"TRAIN_MINUTES=$TRAIN_MINUTES"}; do
  value="${setting#*=}"
  if ! [[ "$value" =~ ^[0-9]*[.]?[0-9]+$ ]] ||
    [ "$(awk -v m="$value" 'BEGIN { print (m > 0) }')" != 1 ]; then
    echo "${setting%%=*} must be a number of minutes above 0, got '$value'" >&2
    exit 2
  fi
done
deadline_s=$(awk -v m="$total_minutes" 'BEGIN { printf "%g", m * 60 }')
run="${RUN_DIR:-runs/quickstart}"
logs="$run/logs"
mkdir -p "$logs"
echo "quickstart in $run: full logs in $logs/ (VERBOSE=1 shows them here)"
# shellcheck disable=SC1091
. "$root/scripts/stage.sh"
# shellcheck disable=SC1091
. "$root/scripts/deadline.sh"
stage_times_start "$run/stages.jsonl" "$started" "$deadline_s"
export SETUP_LOG="$logs/setup.log"
# shellcheck disable=SC1091
. "$root/scripts/setup.sh"
stage_time setup "$(stage_since "$started")"

vocab_size="${VOCAB_SIZE:-8000}"
dupe="${DUPE_FACTOR:-2}"
objective="${OBJECTIVE:-nsp}"
case "$objective" in
  nsp) rows=(--dupe_factor "$dupe") heldout_rows=(--dupe_factor 1) ;;
  mlm) rows=(--objective mlm) heldout_rows=(--objective mlm) ;;
  *) echo "OBJECTIVE must be nsp or mlm, got '$objective'" >&2; exit 2 ;;
esac
max_seq="${MAX_SEQ:-128}"
workers="${WORKERS:-2}"
read -r -a beam_args <<< "${BEAM_ARGS:-}"
runner=(--direct_num_workers="$workers" --direct_running_mode=multi_processing "${beam_args[@]}")

heldout="${HELDOUT:-}" heldout2="${HELDOUT2-}"
packages="${CORPUS_PACKAGES-default}"
if [ -z "${CORPUS:-}" ]; then
  heldout="${HELDOUT:-$run/corpus/stdlib-docs-009.txt}"
  [ -n "$packages" ] && heldout2="${HELDOUT2-$run/corpus/packages-heldout.txt}"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ranks="${RANKS:-$(nvidia-smi -L | wc -l)}"
else
  ranks="${RANKS:-2}"
  export DS_ACCELERATOR=cpu
fi

# DeepSpeed's ops that the trainer would JIT-compile in its own start-up (on CPU the
# shared-memory all-reduce; minutes on a machine without the cache in ~/.cache/torch_extensions
# or after another venv's build), built in the background from here on: the corpus stage
# leaves a core free, and the build's time is spent before training's budget is set, not
# inside it. A build that is up to date costs an import.
ops_exit="$logs/ops.exit"
rm -f "$ops_exit"
(
  rc=0
  python -m trainer.ops "${DS_CONFIG:-deploy/cpu.json}" >"$logs/ops.log" 2>&1 || rc=$?
  echo "$rc" >"$ops_exit"
) &

# stack_ready FILE: waits for the ops' build (its log on stdout), then writes the training
# stack's import time in a fresh process to FILE: the unit of plan_training's estimate.
stack_ready() {
  while [ ! -e "$ops_exit" ]; do sleep 1; done
  cat "$logs/ops.log"
  if [ "$(cat "$ops_exit")" != 0 ]; then return "$(cat "$ops_exit")"; fi
  python -c 'import sys, time
t0 = time.perf_counter()
import deepspeed, torch
print(f"imported torch and DeepSpeed in {time.perf_counter() - t0:.2f} s")
open(sys.argv[1], "w").write(f"{time.perf_counter() - t0:.3f}\n")' "$1"
}

fillmask=""  # the demo, where this checkout has it
if [ -n "$heldout" ] && python -c "import trainer.fillmask" 2>/dev/null; then fillmask=1; fi
stages_total=4  # pipeline, statistics, the training stack, training; then the optional ones
[ -z "${CORPUS:-}" ] && stages_total=$((stages_total + 1))
[ -n "$heldout" ] && stages_total=$((stages_total + 1))
[ -n "$heldout2" ] && stages_total=$((stages_total + 2))  # its shards, its evaluation
[ -n "$fillmask" ] && stages_total=$((stages_total + 1))

if [ -z "${CORPUS:-}" ]; then
  read -r -a package_args <<< "$packages"
  stage "corpus: Python's and the installed packages' docs -> $run/corpus" corpus \
  python -m pipeline corpus --output "$run/corpus" --files 10 \
    --sources ${CORPUS_SOURCES:-docstrings reference} --packages "${package_args[@]}"
  corpus="$run/corpus/stdlib-docs-00[0-8].txt"
  [ -n "$packages" ] && corpus="$corpus $run/corpus/packages-00?.txt"
else
  corpus="$CORPUS"
fi

stage "pipeline: $corpus -> $run/shards" pipeline \
python -m pipeline build --input $corpus --output "$run/shards" --overwrite \
  --vocab_size "$vocab_size" "${rows[@]}" --max_seq_length "$max_seq" "${runner[@]}"
if [ -n "$heldout" ]; then
  stage "held-out shards: $heldout -> $run/heldout (same vocab)" heldout \
  python -m pipeline build --input $heldout --output "$run/heldout" --overwrite \
    --vocab_file "$run/shards/vocab.txt" "${heldout_rows[@]}" --max_seq_length "$max_seq" "${runner[@]}"
fi
if [ -n "$heldout2" ]; then
  stage "second held-out shards: $heldout2 -> $run/heldout2 (same vocab)" heldout2 \
  python -m pipeline build --input $heldout2 --output "$run/heldout2" --overwrite \
    --vocab_file "$run/shards/vocab.txt" "${heldout_rows[@]}" --max_seq_length "$max_seq" "${runner[@]}"
fi
stage "data statistics and plots -> $run/plots" stats \
python -m pipeline stats "$run/shards" --plot --plot_dir "$run/plots"

preset="${PRESET:-tiny}"
eval_args=()
[ -n "$heldout" ] && eval_args=(--eval-data "$run/heldout" --eval-every 500)
train_opts=()  # the trainer options both training and the second evaluation take
[ -n "${PRECISION:-}" ] && train_opts+=(--precision "$PRECISION")
[ -n "${MASKING:-}" ] && train_opts+=(--masking "$MASKING")
[ -n "${MASK_RATE:-}" ] && train_opts+=(--mask-rate "$MASK_RATE")
compile_opts=()  # training's only: the second evaluation, one pass, would pay the compile
[ -n "${COMPILE:-}" ] && compile_opts=(--compile "$COMPILE")

stage "training stack: DeepSpeed's ops (built alongside), its import time" stack \
stack_ready "$logs/stack_import_s"
plan_training "$(cat "$logs/stack_import_s")" "$(python -c 'import json, sys
print(sum(json.load(open(f"{p}/manifest.json"))["num_rows"] for p in sys.argv[1:]))' \
  ${heldout:+"$run/heldout"} ${heldout2:+"$run/heldout2"})"

# The launcher's default port (29500) would join a second run on this machine to the first.
master_port="${MASTER_PORT:-$(python -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
launch=(deepspeed --num_gpus "$ranks" --master_port "$master_port")

rm -rf "$run/train"
stage "training: $preset, $budget_text, $ranks rank(s), ${DS_CONFIG:-deploy/cpu.json}${PRECISION:+, $PRECISION}${COMPILE:+, compile $COMPILE}" train \
"${launch[@]}" trainer/run.py --ds-config "${DS_CONFIG:-deploy/cpu.json}" "${train_opts[@]}" "${compile_opts[@]}" \
  --data "$run/shards" "${eval_args[@]}" --model "$preset" --output-dir "$run/train" \
  --dropout "${DROPOUT:-0}" "${budget[@]}" --log-every 50 --save-every 1000

if [ -n "$heldout2" ]; then
  # The trainer evaluates one --eval-data: the second set is evaluated by resuming the final
  # checkpoint with its budget already spent (no step runs), into its own output directory.
  rm -rf "$run/eval2"
  stage "second held-out evaluation: $run/heldout2 -> $run/eval2" eval2 \
  "${launch[@]}" trainer/run.py --ds-config "${DS_CONFIG:-deploy/cpu.json}" \
    "${train_opts[@]}" --data "$run/shards" --eval-data "$run/heldout2" --model "$preset" \
    --output-dir "$run/eval2" --resume "$run/train/checkpoints" --dropout "${DROPOUT:-0}" \
    "${budget[@]}" --export-hf false --save-every 0
fi

if [ -n "$fillmask" ]; then
  stage "fill-mask demo on held-out sentences" fillmask \
  python -m trainer.fillmask "$run/train/hf" "$run/heldout"
fi

if [ -n "$fillmask" ] && [ "${VERBOSE:-0}" = 0 ]; then
  echo
  echo "== fill-mask demo ($logs/fillmask.log)"
  cat "$logs/fillmask.log"
fi
echo
echo "== summary"
python -m report.summary "$run"
