"""bench/model_speed.py on CPU: its work count by hand, and one tiny run of every peer."""

import json

import torch

from bench import model_speed as bench
from model import BertConfig


def test_matmul_flops_known_answers():
    cfg = BertConfig(
        vocab_size=10,
        hidden_size=4,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=8,
    )
    b = {
        "attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
        "masked_lm_positions": torch.tensor([[1, 0], [0, 0]]),
    }
    # Per token 2 (4 H^2 + 2 H I) = 256; attention 4 H per attended pair; head 2 (H^2 + H V)
    # = 112 per row; pooler and NSP 2 (H^2 + 2 H) = 48 per row; x3 for the backward.
    # Unpadded on CPU: 3 tokens, 2 x 2^2 pairs (one grid as wide as the longest row), 1
    # prediction.
    assert bench.matmul_flops(cfg, b, "ours", True, "cpu") == 3 * (768 + 128 + 112 + 96)
    # On CUDA attention is per row: 2^2 + 1^2 pairs.
    assert bench.matmul_flops(cfg, b, "ours", True, "cuda") == 3 * (768 + 80 + 112 + 96)
    # A batch the model ran padded counts as padded; the padded path: 6 positions, 4 slots.
    padded = 3 * (1536 + 288 + 4 * 112 + 96)
    assert bench.matmul_flops(cfg, b, "ours", False, "cpu") == padded
    assert bench.matmul_flops(cfg, b, "padded", True, "cpu") == padded
    # transformers: the MLM head on every position.
    assert bench.matmul_flops(cfg, b, "hf", True, "cpu") == 3 * (1536 + 288 + 6 * 112 + 96)


def test_a_tiny_run_measures_every_peer(capsys):
    argv = [
        "--preset",
        "tiny",
        "--batch",
        "4",
        "--steps",
        "1",
        "--lengths",
        "docstrings",
        "--no-memory",
    ]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    row = json.loads(lines[1])
    for kind in bench.KINDS:
        assert row[f"{kind}_tokens_per_s"] > 0
    assert row["unpadded_ran"] is True  # docstring lengths: far below 90% real tokens
    assert row["flop_ratio"] > row["flop_unpad_gain"] > 1
    assert "matmul FLOP ratio" in lines[2]
