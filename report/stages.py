"""A quickstart's stage times against its deadline, from ``RUN_DIR/stages.jsonl``.

scripts/stage.sh writes the file, one JSON object a line: the script's start and deadline
(``{"start": 1796180000.1, "deadline_s": 900}``), each stage's seconds in order
(``{"stage": "pipeline", "seconds": 36.2}``), and how training's budget was set
(``{"plan": "deadline", "at_s": 245.1, "budget_s": 541.3, "after_s": 107.2, ...}``: at
``at_s`` seconds from the start, ``after_s`` kept for the training stack's start-up and
what follows training). ``python -m report.summary`` prints them (:func:`stage_lines`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path


def read_stage_times(path: Path) -> tuple[dict, list[dict], dict | None]:
    """(start record, stage records in order, plan record or None) of a stages.jsonl; a torn
    line (a killed run) is skipped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: it has no start record.
    """
    start, stages, plan = None, [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "start" in record:
            start = record
        elif "stage" in record:
            stages.append(record)
        elif "plan" in record:
            plan = record
    if start is None:
        raise ValueError(f"{path} has no start record (scripts/stage.sh writes it first)")
    return start, stages, plan


def stage_lines(path: Path, now: float | None = None) -> list[str]:
    """Each stage's seconds, the total from the script's start to ``now`` (default: the
    clock; the summary is the run's last step), whether that kept the deadline, and how
    training's budget was set; [] without a stages.jsonl, one line naming the problem for
    one without a start record.

    Example: start 1000.0, deadline 900, stages setup 2.0 and train 600.0, now 1880.0 ->
    ``"  total        880.0 s  (to this summary): within the 900 s deadline, 20.0 s to
    spare"`` after one line per stage.
    """
    if not path.is_file():
        return []
    try:
        start, stages, plan = read_stage_times(path)
    except ValueError as err:
        return [f"stage times: {err}"]
    total = (time.time() if now is None else now) - start["start"]
    deadline = start.get("deadline_s")
    lines = [f"stage times ({path}):"]
    for record in stages:
        extra = _budget_text(plan) if record["stage"] == "train" and plan else ""
        lines.append(f"  {record['stage']:<10} {record['seconds']:7.1f} s{extra}")
    if deadline is None:
        lines.append(f"  {'total':<10} {total:7.1f} s  (to this summary)")
        return lines
    if total <= deadline:
        verdict = f"within the {deadline:g} s deadline, {deadline - total:.1f} s to spare"
    else:
        verdict = f"WARNING: past the {deadline:g} s deadline by {total - deadline:.1f} s"
    lines.append(f"  {'total':<10} {total:7.1f} s  (to this summary): {verdict}")
    if plan:
        rest = total - plan["at_s"] - plan["budget_s"]
        lines.append(
            f"  {'':<10} {rest:7.1f} s  outside training's budget after it was set "
            f"(the estimate kept {plan['after_s']:.1f} s)"
        )
    return lines


def _budget_text(plan: dict) -> str:
    """What the training stage's line adds: its budget and where the budget came from."""
    if plan["plan"] == "deadline":
        return (
            f"  budget {plan['budget_s']:.1f} s: the deadline less {plan['at_s']:.1f} s "
            f"spent and {plan['after_s']:.1f} s kept for the rest"
        )
    return f"  budget {plan['budget_s']:.1f} s ({plan['plan']})"
