"""A training run's ``metrics.jsonl``, as the run now stands.

One output directory's file can hold more than one story: a run killed after step 16 and
resumed from its step-15 checkpoint logs steps past 15 twice, and a run started over in the
same directory (``--overwrite``) or resumed from an earlier checkpoint leaves the records of
what it replaced. Every record the trainer writes names its run and its process
(trainer/metrics.py): ``run_id``, the same across resumes and new on a fresh start;
``segment``, new in every process; ``start_step``, the step that process resumed from (0
fresh). :func:`current_run` keeps what the last run's checkpoints now hold:

- the records of the run the last record belongs to, none of another run;
- where a process started at step ``s``, the earlier processes' records past ``s`` are
  dropped: the resumed run did those steps again.

Example (steps of train records): run A logs 5, 10, 15, 16 and is killed; resumed from step
15 it logs 20 -> ``5, 10, 15, 20``. Started over with ``--overwrite`` as run B logging 5 ->
``5`` only.

Records without these keys (runs from before they were written) are kept as they are.
"""

from __future__ import annotations

import json
import logging
import os

logger = logging.getLogger(__name__)

RUN_KEYS = ("run_id", "segment", "start_step")


def read(path: str | os.PathLike) -> list[dict]:
    """Every record of a metrics.jsonl in file order; blank lines, and lines that are not
    JSON (the torn last line of a killed run), are skipped with a warning naming the line.

    Raises:
        FileNotFoundError: no such file.
    """
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                logger.warning(
                    "%s: line %d is not JSON (a run killed mid-write?); skipped", path, number
                )
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def current_run(records: list[dict]) -> list[dict]:
    """The records of the last run as its checkpoints now hold it (module docstring), in
    file order."""
    if not records:
        return []
    run = records[-1].get("run_id")
    kept: list[dict] = []
    segment = None
    for record in records:
        if record.get("run_id") != run:
            continue
        if record.get("segment") != segment:
            segment = record.get("segment")
            start = record.get("start_step")
            if start is not None:  # a new process: what it did again replaces the old
                kept = [r for r in kept if r.get("step", 0) <= start]
        kept.append(record)
    return kept


def read_current(path: str | os.PathLike) -> list[dict]:
    """:func:`current_run` of the file at ``path``."""
    return current_run(read(path))
