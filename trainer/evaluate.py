"""Held-out evaluation: MLM and NSP loss and accuracy over one pass of a shard directory.

Every rank reads its slices of the evaluation stream (trainer/data.py, ``finite=True``), so
all ranks run the same number of forward passes (ZeRO-3 gathers weights in each); filler
rows that complete the last global batch carry no target and count nowhere. Sums are
all-reduced, so the result is over exactly the rows of the directory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import distributed

_KEYS = ("mlm_loss", "mlm_correct", "mlm_total", "nsp_loss", "nsp_correct", "nsp_total")


def batch_sums(out, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64 (6,): summed MLM loss, correct, targets; summed NSP loss, correct, targets.

    Args:
        out: the model output for ``batch`` (mlm_logits (B, P, V), nsp_logits (B, 2)).
        batch: masked_lm_positions / masked_lm_ids (B, P), next_sentence_label (B,),
            -100 where a row has no NSP target.
    """
    targets = batch["masked_lm_positions"] != 0  # (B, P)
    ids = batch["masked_lm_ids"].masked_fill(~targets, -100)
    logits = out.mlm_logits.float()
    mlm_loss = F.cross_entropy(
        logits.flatten(0, 1), ids.flatten(), ignore_index=-100, reduction="sum"
    )
    mlm_correct = ((logits.argmax(-1) == batch["masked_lm_ids"]) & targets).sum()
    labels = batch["next_sentence_label"]
    valid = labels >= 0
    nsp_loss = F.cross_entropy(out.nsp_logits.float(), labels, ignore_index=-100, reduction="sum")
    nsp_correct = ((out.nsp_logits.argmax(-1) == labels) & valid).sum()
    values = (mlm_loss, mlm_correct, targets.sum(), nsp_loss, nsp_correct, valid.sum())
    return torch.stack([v.double() for v in values])


@torch.no_grad()
def evaluate(engine, loader, device: torch.device) -> dict:
    """{"mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "rows"} over the whole loader."""
    was_training = engine.module.training
    engine.eval()
    sums = torch.zeros(len(_KEYS), dtype=torch.float64, device=device)
    try:
        for batch in loader:
            batch.pop("row_ids")
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            out = engine(
                batch["input_ids"], batch["segment_ids"], batch["attention_mask"],
                batch["masked_lm_positions"],
            )  # fmt: skip
            sums += batch_sums(out, batch)
    finally:
        if was_training:
            engine.train()
    c = dict(zip(_KEYS, distributed.all_reduce_sum(sums).tolist(), strict=True))
    return {
        "mlm_loss": c["mlm_loss"] / max(c["mlm_total"], 1.0),
        "mlm_accuracy": c["mlm_correct"] / max(c["mlm_total"], 1.0),
        "nsp_loss": c["nsp_loss"] / max(c["nsp_total"], 1.0),
        "nsp_accuracy": c["nsp_correct"] / max(c["nsp_total"], 1.0),
        "rows": int(c["nsp_total"]),
    }
