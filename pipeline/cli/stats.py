"""``python -m pipeline stats DIR [--plot]``: statistics of a shard directory.

Reads every shard (memory-mapped, checked against the manifest's sha256), and
prints row lengths, masks per row, the 80/10/10 split of predictions and the
random-next share, beside what Google's script gives on English text at seq 128
(about 19 masks on a full row, 14.9% of real tokens masked, random-next 52-54%).
With ``--plot`` it writes ``lengths.png`` and ``masking.png`` into DIR (or
``--plot_dir``).
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
from collections.abc import Sequence

import numpy as np
import pyarrow.compute as pc

from pipeline.options import CommandParser
from pipeline.shards import shard_format
from pipeline.shards.shard_writer import atomic_write_bytes

logger = logging.getLogger(__name__)


def add_shard(
    totals: dict, lengths_hist: np.ndarray, masks_hist: np.ndarray, table, manifest: dict
) -> None:
    """Add one shard's rows (an Arrow table, not empty) to ``totals`` and the histograms of
    row lengths and masks per row."""
    nsp = shard_format.manifest_kind(manifest) == "nsp"
    mask_id = manifest["vocab"]["special_ids"]["mask"]
    sep_id = manifest["vocab"]["special_ids"]["sep"]
    max_len = manifest["schema"]["max_seq_length"]
    lengths = pc.list_value_length(table["input_ids"]).to_numpy()
    ids = pc.list_flatten(table["input_ids"]).to_numpy().astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    if "masked_lm_positions" in table.column_names:
        n_masks = pc.list_value_length(table["masked_lm_positions"]).to_numpy()
        positions = pc.list_flatten(table["masked_lm_positions"]).to_numpy().astype(np.int64)
        original = pc.list_flatten(table["masked_lm_ids"]).to_numpy().astype(np.int64)
    else:  # unmasked MLM rows
        n_masks = np.zeros(len(lengths), dtype=np.int64)
        positions = original = np.zeros(0, dtype=np.int64)
    lengths_hist += np.bincount(lengths, minlength=max_len + 1)
    masks_hist += np.bincount(n_masks, minlength=max_len + 1)
    shown = ids[np.repeat(starts, n_masks) + positions]
    # [CLS] and every [SEP] (NSP rows: one [CLS], two [SEP]; a masked position is text).
    if nsp:
        totals["specials"] += 3 * table.num_rows
        totals["random_next"] += int(pc.sum(table["next_sentence_label"]).as_py() or 0)
    else:
        totals["specials"] += table.num_rows + int((ids == sep_id).sum())
        totals["specials"] -= int((shown == sep_id).sum())
    full = lengths == max_len
    totals["full_rows"] += int(full.sum())
    totals["full_row_masks"] += int(n_masks[full].sum())
    totals["rows"] += table.num_rows
    totals["tokens"] += int(lengths.sum())
    totals["masked"] += len(positions)
    totals["as_mask"] += int((shown == mask_id).sum())
    totals["kept"] += int((shown == original).sum())


def compute_stats(directory: str) -> dict:
    """Statistics recomputed from the shards of ``directory``.

    Raises:
        ValueError: a shard does not match the manifest (names the file).
    """
    manifest = shard_format.read_manifest(directory)
    nsp = shard_format.manifest_kind(manifest) == "nsp"
    max_len = manifest["schema"]["max_seq_length"]
    lengths_hist = np.zeros(max_len + 1, dtype=np.int64)
    masks_hist = np.zeros(max_len + 1, dtype=np.int64)
    totals = dict(
        rows=0,
        tokens=0,
        specials=0,
        masked=0,
        as_mask=0,
        kept=0,
        random_next=0,
        full_rows=0,
        full_row_masks=0,
    )
    for entry in manifest["shards"]:
        path = directory.rstrip("/") + "/" + entry["name"]
        table = shard_format.verify_shard(path, entry)
        if table.num_rows == 0:
            continue
        add_shard(totals, lengths_hist, masks_hist, table, manifest)
    rows, masked = max(totals["rows"], 1), max(totals["masked"], 1)
    # Unmasked MLM rows hold no predictions (the trainer masks them): no shares to give.
    share = (lambda n: round(n / masked, 4)) if totals["masked"] else (lambda n: None)
    real = totals["tokens"] - totals["specials"]
    max_predictions = manifest["params"].get("max_predictions_per_seq", max_len)
    return {
        "rows": totals["rows"],
        "tokens": totals["tokens"],
        "real_tokens": real,  # [CLS] and every [SEP] left out
        "mean_length": round(totals["tokens"] / rows, 3),
        "length_percentiles": histogram_percentiles(lengths_hist, (5, 25, 50, 75, 95, 99)),
        "short_row_share": round(1 - totals["full_rows"] / rows, 4),
        "masks_per_row": round(totals["masked"] / rows, 3),
        "masks_per_full_row": round(totals["full_row_masks"] / max(totals["full_rows"], 1), 3),
        "rows_at_max_predictions_share": round(int(masks_hist[max_predictions:].sum()) / rows, 4),
        "masked_share_of_real_tokens": round(totals["masked"] / max(real, 1), 4),
        "mask_token_share": share(totals["as_mask"]),
        "kept_share": share(totals["kept"]),
        "random_id_share": share(totals["masked"] - totals["as_mask"] - totals["kept"]),
        **({"random_next_share": round(totals["random_next"] / rows, 4)} if nsp else {}),
        "packing_efficiency": round(totals["tokens"] / (rows * max_len), 4),
        "length_histogram": lengths_hist.tolist(),
        "masks_histogram": masks_hist.tolist(),
        "skipped": manifest["skipped"],
    }


def histogram_percentiles(histogram: np.ndarray, percents: Sequence[int]) -> dict[str, int]:
    """Percentiles of the values a histogram counts (value = bin index), e.g.
    ``[0, 2, 1, 1]`` (values 1, 1, 2, 3) -> ``{"p50": 1, "p75": 2}`` for (50, 75)."""
    cumulative = np.cumsum(histogram)
    if not len(cumulative) or cumulative[-1] == 0:
        return {f"p{p}": 0 for p in percents}
    return {
        f"p{p}": int(np.searchsorted(cumulative, p / 100 * cumulative[-1], side="left"))
        for p in percents
    }


def save_png(fig, path: str | os.PathLike) -> None:
    """Render a figure to PNG and write it atomically (``encode.atomic_write_bytes``)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(path, buffer.getvalue())


def plot(stats: dict, out_dir: str) -> list[str]:
    """Write lengths.png and masking.png; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    hist = stats["length_histogram"]
    ax.bar(range(len(hist)), hist, width=1.0)
    ax.set_xlabel("row length (tokens, specials included)")
    ax.set_ylabel("rows")
    ax.set_title(f"Row lengths: {stats['rows']} rows, {100 * stats['short_row_share']:.1f}% short")
    paths.append(os.path.join(out_dir, "lengths.png"))
    fig.tight_layout()
    save_png(fig, paths[-1])
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    masks = stats["masks_histogram"]
    last = max((i for i, c in enumerate(masks) if c), default=0)
    left.bar(range(last + 1), masks[: last + 1], width=1.0)
    left.set_xlabel("predictions per row")
    left.set_ylabel("rows")
    left.set_title(
        f"{stats['masks_per_row']:.2f} per row, {stats['masks_per_full_row']:.2f} per full row"
    )
    shares = [stats["mask_token_share"], stats["random_id_share"], stats["kept_share"]]
    if None in shares:  # unmasked rows: nothing stored to draw
        right.axis("off")
        right.text(0.5, 0.5, "no static masks:\nthe trainer masks these rows", ha="center")
    else:
        right.bar(["[MASK]", "random", "kept"], shares)
        right.axhline(0.8, ls="--", c="gray")
        right.axhline(0.1, ls="--", c="gray")
    if "random_next_share" in stats:
        right.set_title(f"Predictions; random-next {100 * stats['random_next_share']:.1f}%")
    else:
        right.set_title("Predictions (MLM rows: no next-sentence label)")
    paths.append(os.path.join(out_dir, "masking.png"))
    fig.tight_layout()
    save_png(fig, paths[-1])
    plt.close(fig)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = CommandParser.of_doc("python -m pipeline stats", __doc__)
    p.add_argument("directory", help="a shard directory written by `python -m pipeline build`")
    p.add_argument("--plot", action="store_true", help="also write lengths.png and masking.png")
    p.add_argument("--plot_dir", default=None, help="where to write the plots (default: DIRECTORY)")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    args = p.parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        logger.error("--plot needs matplotlib: pip install matplotlib (or the [train] extra)")
        return 2
    try:
        stats = compute_stats(args.directory)
    except (ValueError, OSError) as e:
        logger.error("%s", e)
        return 1
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        for key, value in stats.items():
            if not key.endswith("histogram"):
                print(f"{key:>30}: {value}")
    if args.plot:
        out = args.plot_dir or args.directory
        os.makedirs(out, exist_ok=True)
        for path in plot(stats, out):
            logger.info("wrote %s", path)
    return 0
