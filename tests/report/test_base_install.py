"""The reports need no training stack: ``report.summary``, ``report.plot`` and ``pipeline
stats --plot`` run on the base install plus matplotlib (scripts/test.sh runs this file in
.venv-report, which holds only that; in the full environment it checks that none of them
imports torch, DeepSpeed or trainer/)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STACK = ("torch", "deepspeed", "trainer", "model", "finetune")

RUN_REPORTS = """
import sys
from pipeline.cli.main import main as pipeline
from report.plot import main as plot
from report.summary import main as summary
run, shards = sys.argv[1:3]
assert summary([run]) == 0
assert plot([run + "/train"]) == 0
assert pipeline(["stats", shards, "--plot", "--plot_dir", run + "/stats"]) == 0
print("loaded:", sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[3:])))
"""


def test_summary_plots_and_stats_plots_run_without_the_training_stack(small_shards, tmp_path):
    pytest.importorskip("matplotlib", reason="the plots draw with matplotlib")
    (tmp_path / "train").mkdir()
    records = [
        {
            "step": s,
            "split": "train",
            "loss": 9 - s / 100,
            "lr": 1e-3,
            "sequences_per_s": 40.0,
            "tokens_per_s": 3000.0,
        }
        for s in (50, 100)
    ]
    records.append(
        {
            "step": 100,
            "split": "eval",
            "rows": 800,
            "mlm_accuracy": 0.31,
            "nsp_accuracy": 0.7,
            "mlm_baseline_accuracy": 0.06,
            "nsp_baseline_accuracy": 0.6,
        }
    )
    (tmp_path / "train" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records)
    )
    (tmp_path / "stages.jsonl").write_text(
        '{"start": 0, "deadline_s": 900}\n{"stage": "setup", "seconds": 2.0}\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", RUN_REPORTS, str(tmp_path), str(small_shards), *STACK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout
    assert "  MLM accuracy 0.310 (most-frequent-token baseline 0.060, +0.250)" in done.stdout
    assert "  setup          2.0 s" in done.stdout and "past the 900 s deadline" in done.stdout
    pngs = [*(tmp_path / "train" / "plots").glob("*.png"), *(tmp_path / "stats").glob("*.png")]
    assert len(pngs) >= 5 and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
