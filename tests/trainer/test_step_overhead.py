"""bench/step_overhead.py: its counters see what they claim, and the shipped GPU configs make
DeepSpeed synchronize nothing for its own timing.

The counts (aten ops dispatched, host reads of tensor values, by call site) do not drift with
the machine's load, so they can be tested; the times cannot, and are not.
"""

import collections
import json
from pathlib import Path

import pytest
import torch

from bench import step_overhead

ROOT = Path(__file__).resolve().parents[2]


def test_the_counters_see_ops_and_reads_at_their_call_site():
    counter, sites = step_overhead.OpCounter(), collections.Counter()
    x = torch.ones(3)
    with counter, step_overhead.counting_reads(sites):
        y = (x * 2).sum()
        value = y.item()  # a read, named at this line
        flag = bool(y > 0)
    assert value == 6.0 and flag
    assert counter.ops >= 3  # mul, sum, gt
    here = "tests/trainer/test_step_overhead.py"
    line = test_the_counters_see_ops_and_reads_at_their_call_site.__code__.co_firstlineno + 5
    name = "test_the_counters_see_ops_and_reads_at_their_call_site"
    assert sites[f"Tensor.item @ {here}:{line} {name}"] == 1, sites
    assert any(site.startswith("Tensor.__bool__ @ " + here) for site in sites)
    assert torch.Tensor.item is not None and "read" not in torch.Tensor.item.__qualname__


GPU_CONFIGS = ("gpu.json", "zero2.json", "zero3.json")


def bench_rows(*argv: str) -> list[dict]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        step_overhead.main([*argv, "--steps", "1", "--count-steps", "1"])
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def rows():
    """bench/step_overhead.py's rows for the shipped GPU configs, on the micro-BERT."""
    return bench_rows("--ds-config", *(str(ROOT / "deploy" / name) for name in GPU_CONFIGS))


def first_gpu_config() -> str:
    """The config deploy/README.md's commands give first for a one-node GPU launch."""
    import re

    text = (ROOT / "deploy" / "README.md").read_text()
    one_node = (
        r"# one node, \d+ GPUs\ndeepspeed --num_gpus \d+ trainer/run.py --ds-config deploy/(\S+)"
    )
    return re.search(one_node, text).group(1)


def test_every_arm_is_counted(rows):
    assert [Path(row["ds_config"]).name for row in rows] == list(GPU_CONFIGS)
    for row in rows:
        assert row["bare"]["ops_per_step"] > 1000 and row["trainer"]["ops_per_step"] > 1000
        assert row["ops_ratio"] == pytest.approx(
            row["trainer"]["ops_per_step"] / row["bare"]["ops_per_step"], abs=1e-3
        )
        assert row["dtype"] == "bfloat16" and row["threads"] == 1


def test_the_first_gpu_config_steps_at_its_models_cost(rows):
    """Issue 52's targets, counted (not timed) on the micro-BERT, for the config a one-node
    GPU launch is given first: the trainer's aten ops per optimizer step at most 1.25x the
    bare model step's, and no device read on a non-log step but at most 2 (in DeepSpeed or
    torch; none in the trainer, tested below). DeepSpeed's ZeRO-2 engine measured 2.66x and
    4 reads (docs/results.md)."""
    first = first_gpu_config()
    (row,) = [r for r in rows if Path(r["ds_config"]).name == first]
    assert row["engine"] == "torch"
    assert row["ops_ratio"] <= 1.25, row["ops_ratio"]
    assert len(device_reads(row, inside=("",))) <= 2, row["trainer"]["read_sites"]


def test_an_accumulation_micro_step_costs_a_forward_and_backward():
    """Each micro-step past the first of an optimizer step dispatches at most 1.1x the ops of
    a plain forward and backward (the gradient hooks and bucket copies of ZeRO-2 made it
    2.2x)."""
    (row,) = bench_rows("--ds-config", str(ROOT / "deploy" / first_gpu_config()), "--accum", "2")
    assert row["extra_micro_ratio"] <= 1.1, (row["extra_micro_ops"], row["fwd_bwd_ops"])


def test_shipped_gpu_configs_do_not_synchronize_to_time_steps(rows):
    # DeepSpeed's throughput timer synchronizes the device twice a step; deploy/README.md
    # says why the shipped configs turn it off. Switched back on, this fails.
    for row in rows:
        timing = [s for s in row["trainer"]["read_sites"] if s.startswith("accelerator.sync")]
        assert not timing, (row["ds_config"], timing)


def test_zero2_does_not_check_gradients_for_overflow(rows):
    # bf16.check_grad_overflow (deploy/README.md): an inf/NaN check of every gradient
    # partition and a device read a step, to skip steps the trainer stops on instead.
    (zero2,) = [r for r in rows if Path(r["ds_config"]).name == "zero2.json"]
    overflow = [s for s in zero2["trainer"]["read_sites"] if "has_overflow" in s]
    assert not overflow, overflow


# The trainer's reads that touch host tensors only: the loader's, the counts of a batch
# taken before it is moved to the device, and on a log step the values of its one read.
# On a GPU none of them waits for the device.
HOST_SIDE = {
    "trainer/data.py": ("from_transfer", "group_from_transfer"),
    "trainer/metrics.py": ("host_counts", "model_flops", "summarize"),
    "trainer/loop.py": ("split_log_read",),
    "trainer/evaluate.py": ("baselines",),
}


def device_reads(row: dict, inside=(" @ trainer/",)) -> list[str]:
    """The read sites of a row's trainer arm in code under ``inside``, host-side ones left
    out; each is named once per read a step."""
    sites = row["trainer"]["read_sites"]
    return [
        site
        for site, count in sites.items()
        for _ in range(round(count))
        if any(part in site for part in inside)
        and not any(
            f"@ {path}:" in site and site.rsplit(" ", 1)[-1] in functions
            for path, functions in HOST_SIDE.items()
        )
    ]


def test_a_log_step_reads_the_device_once_on_the_first_gpu_config(rows):
    """Its counts, gradient norm and non-finite check come back in one packed read (on the
    torch engine, which skips a non-finite update on the device, the check waits for it)."""
    row = next(r for r in rows if r["ds_config"].endswith(first_gpu_config()))
    log_row = {"trainer": {"read_sites": row["trainer"]["log_step_read_sites"]}}
    assert len(device_reads(log_row)) == 1, device_reads(log_row)


def test_the_trainer_reads_nothing_from_the_device_on_a_non_log_step(rows):
    # Its clock and stop signal are agreed on the host, and the non-finite flag stays on
    # the device until a step that reads it anyway (trainer/loop.py). A `.item()` or a
    # `float(tensor)` added to the step fails here, named by its call site.
    for row in rows:
        assert not device_reads(row), (row["ds_config"], device_reads(row))
