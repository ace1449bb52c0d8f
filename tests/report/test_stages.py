"""The quickstart's stage times: scripts/stage.sh writes them, the summary prints them
against the deadline."""

import json
import re
import subprocess
from pathlib import Path

from report.stages import read_stage_times, stage_lines

ROOT = Path(__file__).resolve().parents[2]
PLAN = {"plan": "deadline", "at_s": 250.0, "budget_s": 540.0, "after_s": 100.0, "unit_s": 3.5}


def write(path, *records, torn=False):
    text = "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(text + ('{"stage": "ev' if torn else ""), encoding="utf-8")
    return path


def test_a_kept_deadline_lists_each_stage_the_total_and_the_budgets_origin(tmp_path):
    path = write(
        tmp_path / "stages.jsonl",
        {"start": 1000.0, "deadline_s": 900},
        {"stage": "setup", "seconds": 2.0},
        PLAN,
        {"stage": "train", "seconds": 600.0},
        torn=True,
    )
    lines = stage_lines(path, now=1880.0)
    assert lines == [
        f"stage times ({path}):",
        "  setup          2.0 s",
        "  train        600.0 s  budget 540.0 s: the deadline less 250.0 s spent and 100.0 s "
        "kept for the rest",
        "  total        880.0 s  (to this summary): within the 900 s deadline, 20.0 s to spare",
        "                90.0 s  outside training's budget after it was set (the estimate kept "
        "100.0 s)",
    ]


def test_a_missed_deadline_is_a_warning_and_train_minutes_is_named(tmp_path):
    plan = {**PLAN, "plan": "TRAIN_MINUTES", "budget_s": 660.0}
    path = write(
        tmp_path / "stages.jsonl",
        {"start": 0.0, "deadline_s": 900},
        plan,
        {"stage": "train", "seconds": 700.0},
    )
    lines = stage_lines(path, now=1000.0)
    assert lines[1] == "  train        700.0 s  budget 660.0 s (TRAIN_MINUTES)"
    assert "WARNING: past the 900 s deadline by 100.0 s" in lines[2]


def test_no_file_no_lines_and_no_start_one_line(tmp_path):
    assert stage_lines(tmp_path / "stages.jsonl") == []
    path = write(tmp_path / "stages.jsonl", {"stage": "setup", "seconds": 1.0})
    assert stage_lines(path) == [
        f"stage times: {path} has no start record (scripts/stage.sh writes it first)"
    ]


def test_stage_sh_writes_what_the_summary_reads(tmp_path):
    script = f"""
set -euo pipefail
logs={tmp_path} stages_total=2
. {ROOT / "scripts" / "stage.sh"}
stage_times_start {tmp_path / "stages.jsonl"} 1000.5 900
stage_time setup 2.5
stage "a title" quick sleep 0.5
stage "a failing one" broken false
"""
    # The stage outlasts its ticker's start: the ticker's sleep must not outlive the script
    # and hold its stdout (the 60 s a non-terminal ticker sleeps; 20 s is the bound here).
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=20)
    assert done.returncode == 1, done.stderr
    assert re.search(r"^\[1/2\] a title \.\.\. done in [01] s", done.stdout, re.M), done.stdout
    start, stages, plan = read_stage_times(tmp_path / "stages.jsonl")
    assert start == {"start": 1000.5, "deadline_s": 900} and plan is None
    assert [s["stage"] for s in stages] == ["setup", "quick", "broken"]  # a failed one too
    assert stages[0]["seconds"] == 2.5 and 0 <= stages[1]["seconds"] < 10
