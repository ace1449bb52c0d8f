"""scripts/quickstart.sh's deadline: its settings checked before it installs anything, and
training's budget (scripts/deadline.sh) as what the deadline leaves."""

import json
import subprocess
import time
from pathlib import Path

import pytest

from report.stages import read_stage_times

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["TOTAL_MINUTES", "TRAIN_MINUTES"])
def test_a_deadline_or_budget_that_is_not_minutes_stops_it_before_it_installs(tmp_path, name):
    for value in ("abc", "0", "-3", "1e3"):
        env = {"PATH": "/usr/bin:/bin", name: value, "RUN_DIR": str(tmp_path / "run")}
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "quickstart.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"{name} must be a number of minutes above 0, got '{value}'" in done.stderr
        assert not (tmp_path / "run").exists()


def plan(tmp_path, spent_s: float, **env) -> tuple[str, dict | None]:
    """Runs plan_training as the quickstart does, ``spent_s`` after the start, with a 3.5 s
    unit and 1,000 held-out rows and both later stages; returns (stdout, plan record)."""
    settings = "".join(f"{k}={v} " for k, v in env.items())
    script = f"""
set -euo pipefail
. {ROOT / "scripts" / "stage.sh"}
. {ROOT / "scripts" / "deadline.sh"}
started={time.time() - spent_s:.3f} deadline_s=900 total_minutes=15 heldout2=h fillmask=1
stage_times_start {tmp_path / "stages.jsonl"} "$started" "$deadline_s"
{settings}plan_training 3.5 1000
echo "budget: ${{budget[*]}} ($budget_text)"
"""
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout, read_stage_times(tmp_path / "stages.jsonl")[2]


def test_training_gets_the_deadline_less_what_was_spent_and_the_estimate(tmp_path):
    out, record = plan(tmp_path, spent_s=250)
    # 3.5 s x (14 train + 9 second evaluation + 5 fill-mask + 1 summary + 0.0035 x 1000 rows)
    assert record["after_s"] == pytest.approx(113.8) and record["plan"] == "deadline"
    assert record["at_s"] == pytest.approx(250, abs=2)
    assert record["budget_s"] == pytest.approx(900 - record["at_s"] - 113.8, abs=0.11)
    minutes = record["budget_s"] / 60
    assert f"budget: --max-minutes {minutes:.4f} ({minutes:.2f} minutes)" in out
    assert "training gets" in out and "WARNING" not in out


def test_train_minutes_wins_and_says_it_misses_the_deadline(tmp_path):
    out, record = plan(tmp_path, spent_s=250, TRAIN_MINUTES=11)
    assert record["plan"] == "TRAIN_MINUTES" and record["budget_s"] == 660
    assert "budget: --max-minutes 11.0000 (11.00 minutes)" in out
    assert "WARNING: the run will end about 124 s past its 15-minute deadline" in out


def test_a_spent_deadline_still_trains_a_minute_and_warns(tmp_path):
    out, record = plan(tmp_path, spent_s=880)
    assert record["budget_s"] == 60 and "WARNING: the run will end about" in out


def test_max_steps_is_not_planned(tmp_path):
    out, record = plan(tmp_path, spent_s=10, MAX_STEPS=50)
    assert record is None and "budget: --max-steps 50 (50 steps)" in out
    assert json.loads((tmp_path / "stages.jsonl").read_text())["deadline_s"] == 900


def test_a_failed_stage_names_its_last_error_line_and_its_log(tmp_path):
    # What a user sees when the pipeline stage fails: the exit code, the error, the log.
    failing = (
        "echo '2026-12-06 04:00:00,000 INFO pipeline: reading 9 files'; "
        "echo '2026-12-06 04:00:01,000 ERROR pipeline: build failed: Return value not iterable'; "
        "echo 'Traceback (most recent call last):'; echo '  File \"x.py\", line 1'; exit 3"
    )
    script = f"""
set -euo pipefail
logs={tmp_path} stages_total=6
. {ROOT / "scripts" / "stage.sh"}
stage "pipeline: corpus -> shards" pipeline bash -c {json.dumps(failing)}
echo "not reached"
"""
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stdout + done.stderr
    assert (
        "[1/6] pipeline FAILED: 2026-12-06 04:00:01,000 ERROR pipeline: build failed: "
        "Return value not iterable"
    ) in done.stdout
    assert f"[1/6] pipeline: the whole log is {tmp_path}/pipeline.log" in done.stdout
    assert "not reached" not in done.stdout


@pytest.mark.parametrize(
    ("lines", "named"),
    [
        (
            ["Collecting foo", "ERROR: No matching distribution found for foo==9", "x"],
            "ERROR: No matching distribution found for foo==9",
        ),
        (
            ["Traceback (most recent call last):", '  File "a.py"', "ValueError: bad flag"],
            "ValueError: bad flag",
        ),
        (
            ["[rank 1] ERROR [rank 1] trainer: shard-00001.arrow: bad id", "done"],
            "[rank 1] ERROR [rank 1] trainer: shard-00001.arrow: bad id",
        ),
        (["nothing went wrong here", "the last line"], "the last line"),
    ],
)
def test_last_error_line(tmp_path, lines, named):
    log = tmp_path / "x.log"
    log.write_text("\n".join(lines) + "\n")
    script = f". {ROOT / 'scripts' / 'errors.sh'}; last_error_line {log}"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == named
