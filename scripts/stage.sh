#!/usr/bin/env bash
# stage TITLE NAME CMD...: run one stage of scripts/quickstart.sh with a readable console.
#
# CMD's whole output (stdout and stderr, with BERT_VERBOSE=1 so that Beam's and DeepSpeed's
# logs are in it) goes to $logs/NAME.log. The console gets one line,
#   [2/6] pipeline: corpus/*.txt -> runs/quickstart/shards ... done in 80 s  (runs/quickstart/logs/pipeline.log)
# and while CMD runs, on a terminal, a live one with the elapsed time and the stage's latest
# progress line (the last line of one of our own loggers, pipeline.* or trainer.*),
#   [4/6] train ... 95 s  step 300/1500  loss 6.1234  MLM acc 0.123 ... ETA 4m12s
# and a line like it every minute otherwise (a file, CI). When CMD fails: the end of its
# log, its last error line and the log's path, and the script stops with CMD's exit code. VERBOSE=1: CMD's output on the console as
# well. Sourced by scripts/quickstart.sh, which sets $logs and $stages_total.
#
# Stage times: with $stage_times set (stage_times_start), each stage's seconds are appended
# to that file, one JSON object a line, which `python -m report.summary` prints with the
# deadline:
#   {"start": 1796180000.123, "deadline_s": 900}   the script's start (epoch s) and deadline
#   {"stage": "pipeline", "seconds": 36.2}         one per stage, in order (a failed one too)
#   {"plan": "deadline", "at_s": 245.1, "budget_s": 541.3, "after_s": 107.2, "unit_s": 3.5}
#       how training's budget was set (scripts/deadline.sh)

# shellcheck disable=SC1091
. "$(dirname "${BASH_SOURCE[0]}")/errors.sh"
stage_number=0
stage_times=""

# stage_clock: seconds since the epoch, to the millisecond.
stage_clock() { date +%s.%3N; }

# stage_since T: seconds from T (a stage_clock) to now, to a tenth.
stage_since() { awk -v t0="$1" -v t1="$(stage_clock)" 'BEGIN { printf "%.1f", t1 - t0 }'; }

# stage_times_start FILE START DEADLINE_S: a new stage-time file for a script started at START.
stage_times_start() {
  stage_times="$1"
  printf '{"start": %s, "deadline_s": %s}\n' "$2" "$3" >"$stage_times"
}

# stage_time NAME SECONDS: one stage's time in the stage-time file (none without one).
stage_time() {
  if [ -n "$stage_times" ]; then
    printf '{"stage": "%s", "seconds": %s}\n' "$1" "$2" >>"$stage_times"
  fi
}
# A log line of ours: "2026-01-01 12:00:00,000 INFO pipeline: ...", "... INFO [rank 0]
# trainer.metrics: ...", or a Beam worker's "INFO:pipeline.documents:...".
ours_pattern='^[^A-Za-z]*(INFO|WARNING|ERROR)[: ](\[rank [0-9]+\] )?(pipeline|trainer)[a-z_.]*: ?'

# stage_progress LOG: our latest line in LOG, without its prefix.
stage_progress() {
  { tail -n 300 "$1" | grep -E "$ours_pattern" | tail -n 1 | sed -E "s/$ours_pattern//"; } \
    2>/dev/null || true
}

# stage_ticker LABEL LOG: the live line, until killed or until the script is gone.
stage_ticker() {
  local label="$1" log="$2" t0=$SECONDS width line sleeper
  # Its sleep goes with it, and holds none of the script's output open. The trap kills the
  # jobs the shell knows (`jobs -p`), not `$sleeper`: a kill that landed between `sleep &`
  # and `sleeper=$!` left the sleep running, holding stdout, and a caller reading it to the
  # end (a pipe, a test) waited up to a minute after the script.
  trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM
  if [ -t 1 ]; then
    width=$( (stty size </dev/tty) 2>/dev/null | cut -d' ' -f2)
    [ "${width:-0}" -gt 20 ] || width=100
    while kill -0 "$$" 2>/dev/null; do
      line="$label ... $((SECONDS - t0)) s  $(stage_progress "$log")"
      printf '\r\033[K%s' "${line:0:$((width - 1))}"
      sleep 1 </dev/null >/dev/null 2>&1 &
      sleeper=$!
      wait "$sleeper"
    done
  else
    while kill -0 "$$" 2>/dev/null; do
      sleep 60 </dev/null >/dev/null 2>&1 &
      sleeper=$!
      wait "$sleeper"
      echo "$label ... $((SECONDS - t0)) s  $(stage_progress "$log")"
    done
  fi
}

stage() {
  local title="$1" name="$2" log="$logs/$2.log" t0=$SECONDS clock0 rc=0 ticker
  clock0=$(stage_clock)
  shift 2
  stage_number=$((stage_number + 1))
  local label="[$stage_number/$stages_total] $title" short="[$stage_number/$stages_total] $name"
  if [ "${VERBOSE:-0}" != 0 ]; then
    echo "$label  (log: $log)"
    BERT_VERBOSE=1 "$@" 2>&1 | tee "$log" || rc=$?
  else
    stage_ticker "$short" "$log" &
    ticker=$!
    BERT_VERBOSE=1 "$@" >"$log" 2>&1 || rc=$?
    kill "$ticker" 2>/dev/null || true
    wait "$ticker" 2>/dev/null || true
    if [ -t 1 ]; then printf '\r\033[K'; fi
  fi
  stage_time "$name" "$(stage_since "$clock0")"
  if [ "$rc" -ne 0 ]; then
    echo "$label ... FAILED (exit $rc) after $((SECONDS - t0)) s; log: $log"
    if [ "${VERBOSE:-0}" = 0 ]; then tail -n 30 "$log" | sed 's/^/    /'; fi
    echo "$short FAILED: $(last_error_line "$log")"
    echo "$short: the whole log is $log"
    exit "$rc"
  fi
  echo "$label ... done in $((SECONDS - t0)) s  ($log)"
}
