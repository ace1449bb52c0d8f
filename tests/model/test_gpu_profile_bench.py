"""bench/gpu_profile.py on CPU: one tiny step's phases and top ops, as JSON and a table."""

import json

from bench import gpu_profile


def test_a_tiny_profile_reports_phases_and_ops(tmp_path, capsys):
    out = tmp_path / "profile.jsonl"
    argv = ["--device", "cpu", "--dtype", "fp32", "--preset", "tiny", "--batch", "2"]
    argv += ["--seq", "32", "--warmup", "1", "--steps", "2", "--profile-steps", "1"]
    # --top above the number of distinct ops: the whole list, whose order and shares are
    # checked; which op ranks first is timing, and a loaded machine reorders it.
    argv += ["--top", "1000", "--json", str(out)]
    assert gpu_profile.main(argv) == 0
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == json.dumps(row)
    ph = row["phases_s"]
    assert all(ph[k] > 0 for k in ("forward", "backward", "optimizer"))
    # The median step is at least its largest median phase (phases of one step sum to it).
    assert ph["step"] >= max(ph["forward"], ph["backward"], ph["optimizer"])
    assert row["host_syncs_per_step"] is None  # counted on CUDA only
    kernels = row["top_kernels"]
    assert len(printed) == 2 + len(kernels)  # the JSON, the summary line, one line an op
    # The busy time is all kernels' (on CPU: all ops' self time); the whole list sums to it.
    top_ms = sum(k["ms_per_step"] for k in kernels)
    assert abs(top_ms - row["kernel_ms_per_step"]) <= 1e-3 * len(kernels)
    assert abs(sum(k["share"] for k in kernels) - 1) <= 1e-4 * len(kernels)
    assert [k["share"] for k in kernels] == sorted((k["share"] for k in kernels), reverse=True)
    calls = {k["kernel"]: k["calls_per_step"] for k in kernels}
    assert all(n >= 1 and n == int(n) for n in calls.values())  # one profiled step
    # A BERT step's matmuls are there, each linear layer's forward and backward.
    assert calls.get("aten::mm", 0) + calls.get("aten::addmm", 0) >= 2
