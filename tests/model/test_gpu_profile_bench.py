"""bench/gpu_profile.py on CPU: one tiny step's phases and top ops, as JSON and a table."""

import json

from bench import gpu_profile


def test_a_tiny_profile_reports_phases_and_ops(tmp_path, capsys):
    out = tmp_path / "profile.jsonl"
    argv = ["--device", "cpu", "--dtype", "fp32", "--preset", "tiny", "--batch", "2"]
    argv += ["--seq", "32", "--warmup", "1", "--steps", "2", "--profile-steps", "1"]
    argv += ["--top", "4", "--json", str(out)]
    assert gpu_profile.main(argv) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert capsys.readouterr().out.splitlines()[0] == json.dumps(row)
    ph = row["phases_s"]
    assert all(ph[k] > 0 for k in ("forward", "backward", "optimizer"))
    # The median step is at least its largest median phase (phases of one step sum to it).
    assert ph["step"] >= max(ph["forward"], ph["backward"], ph["optimizer"])
    assert row["host_syncs_per_step"] is None  # counted on CUDA only
    kernels = row["top_kernels"]
    # The busy time is all kernels' (on CPU: all ops' self time); the top ones are a part.
    top_ms = sum(k["ms_per_step"] for k in kernels)
    assert top_ms <= row["kernel_ms_per_step"] + 1e-3
    assert abs(sum(k["share"] for k in kernels) - top_ms / row["kernel_ms_per_step"]) < 0.01
    assert 1 <= len(kernels) <= 4
    assert [k["share"] for k in kernels] == sorted((k["share"] for k in kernels), reverse=True)
    assert 0 < sum(k["share"] for k in kernels) <= 1.0001
    assert any("mm" in k["kernel"] for k in kernels)  # a BERT step is matmuls first
