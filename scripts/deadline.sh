#!/usr/bin/env bash
# plan_training UNIT_S ROWS: scripts/quickstart.sh's training budget under its deadline.
#
# The quickstart ends within TOTAL_MINUTES of its start. Training's time budget
# (--max-minutes, over which the learning rate decays) is what the stages before it left,
# less an estimate of what is not in the budget yet still to come: the trainer's own
# start-up before step 1 (the budget's clock starts at the first step) and its end, then the
# stages after it. Sets the array `budget` (the trainer's flags) and `budget_text`, prints
# one "[plan]" line (and a warning when the run will miss the deadline), and appends the
# plan to the stage times (scripts/stage.sh).
#
# UNIT_S: the training stack's import time, measured in this run just before (the quickstart's
# "stack" stage); ROWS: the held-out rows evaluated after the budget. Reads $started,
# $deadline_s and $total_minutes (quickstart.sh), $heldout2 and $fillmask (whether those
# stages run), TRAIN_MINUTES and MAX_STEPS. Sourced after scripts/stage.sh.
# shellcheck disable=SC2034,SC2154  # sourced: the quickstart's variables, read and set

# What is still to come, in units of UNIT_S. It is mostly process start-up: each DeepSpeed
# launch starts the launcher and two ranks that import the stack, build the model and the
# engine, load or save a checkpoint, and exit; the fill-mask demo imports torch and
# transformers. Those slow down with the machine, and with the other work on it, as the
# import does, so a unit measured in this run carries both into the estimate, where a fixed
# number of seconds would hold for one machine under one load. The held-out rows evaluated
# after the budget (training's final evaluation, the second set's) add their share. Each
# constant is its part's cost on a 2-core machine in these units, raised by about a third:
# the load can change during a run.
TRAIN_UNITS=14  # the trainer's start-up before step 1, and after its budget the final
#                 checkpoint, the Hugging Face export, the plots and the exit
EVAL2_UNITS=9  # the second held-out set's evaluation: a launch resuming the checkpoint
FILLMASK_UNITS=5  # the fill-mask demo
SUMMARY_UNITS=1  # the demo's printout and the summary
ROW_UNITS=0.0035  # each held-out row evaluated after the budget (2 CPU ranks, tiny)
MIN_BUDGET_S=60  # training's least budget when the deadline leaves less (a warning says so)

plan_training() {
  local unit_s="$1" rows="$2" after_s at_s budget_s over_s plan=deadline
  if [ -n "${MAX_STEPS:-}" ]; then
    budget=(--max-steps "$MAX_STEPS") budget_text="$MAX_STEPS steps"
    echo "[plan] MAX_STEPS=$MAX_STEPS sets training's length: the $total_minutes-minute" \
      "deadline is not planned for"
    return
  fi
  after_s=$(awk -v u="$unit_s" -v rows="$rows" -v e2="${heldout2:+1}" -v fm="${fillmask:-}" \
    -v t="$TRAIN_UNITS" -v e="$EVAL2_UNITS" -v f="$FILLMASK_UNITS" -v s="$SUMMARY_UNITS" \
    -v r="$ROW_UNITS" 'BEGIN { printf "%.1f", u * (t + (e2 ? e : 0) + (fm ? f : 0) + s + r * rows) }')
  at_s=$(stage_since "$started")
  if [ -n "${TRAIN_MINUTES:-}" ]; then
    plan=TRAIN_MINUTES
    budget_s=$(awk -v m="$TRAIN_MINUTES" 'BEGIN { printf "%.1f", m * 60 }')
  else
    budget_s=$(awk -v d="$deadline_s" -v at="$at_s" -v a="$after_s" -v least="$MIN_BUDGET_S" \
      'BEGIN { b = d - at - a; printf "%.1f", (b < least ? least : b) }')
  fi
  over_s=$(awk -v d="$deadline_s" -v at="$at_s" -v a="$after_s" -v b="$budget_s" \
    'BEGIN { printf "%.0f", at + b + a - d }')
  echo "[plan] deadline $deadline_s s (TOTAL_MINUTES=$total_minutes): $at_s s spent, $after_s s" \
    "kept for the rest (the stack imported in $unit_s s; $rows held-out rows to evaluate" \
    "after training): training gets $budget_s s${TRAIN_MINUTES:+ (TRAIN_MINUTES=$TRAIN_MINUTES)}"
  if [ "$over_s" -gt 0 ]; then
    echo "[plan] WARNING: the run will end about $over_s s past its $total_minutes-minute" \
      "deadline${TRAIN_MINUTES:+ (TRAIN_MINUTES=$TRAIN_MINUTES)}"
  fi
  if [ -n "${stage_times:-}" ]; then
    printf '{"plan": "%s", "at_s": %s, "budget_s": %s, "after_s": %s, "unit_s": %s}\n' \
      "$plan" "$at_s" "$budget_s" "$after_s" "$unit_s" >>"$stage_times"
  fi
  budget=(--max-minutes "$(awk -v b="$budget_s" 'BEGIN { printf "%.4f", b / 60 }')")
  budget_text="$(awk -v b="$budget_s" 'BEGIN { printf "%.2f", b / 60 }') minutes"
}
