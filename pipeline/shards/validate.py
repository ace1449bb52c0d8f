"""Validate a shard directory the way a trainer relies on it: the contract of FORMAT.md, checked.

The manifest, every shard's size, sha256, schema and row count, then every row's content
(ids in the vocab, rows ``[CLS] ... [SEP]`` of at most ``max_seq_length``, segment ids 0
then 1, special ids only where the format puts them, masked positions inside the row and
increasing, at most ``max_predictions_per_seq`` of them, labels 0/1). The first problem
raises ShardFormatError naming the file and the row. ``python -m pipeline validate DIR``
runs it (pipeline/cli/inspect_cli.py).
"""

from __future__ import annotations

import numpy as np

from pipeline.shards import shard_format, shard_writer


def check_rows(table, manifest: dict, where: str) -> None:
    """Content checks of one shard's rows against the manifest.

    Raises:
        ShardFormatError: the first bad row, named with ``where``.
    """
    vocab_size = manifest["schema"]["vocab_size"]
    max_seq = manifest["schema"]["max_seq_length"]
    try:
        flat = shard_writer.check_table_rows(table, vocab_size, max_seq)
    except ValueError as err:
        raise shard_format.ShardFormatError(f"{where}: {err}") from None
    offsets = flat["input_ids"][1]
    if table.num_rows:
        segments, _ = flat["segment_ids"]
        # Segment ids never step down within a row: 0 ... 0 1 ... 1.
        step_down = np.flatnonzero(np.diff(segments.astype(np.int8)) < 0) + 1
        inside = ~np.isin(step_down, offsets)
        if inside.any():
            row = int(np.searchsorted(offsets, step_down[inside][0], side="right")) - 1
            raise shard_format.ShardFormatError(f"{where}: row {row} has segment ids 1 then 0")
        check_special_ids(flat, manifest["vocab"]["special_ids"], where)
    limit = manifest["params"].get("max_predictions_per_seq")
    if limit is not None:
        counts = np.diff(flat["masked_lm_positions"][1])
        _first_bad(counts > limit, where, f"has more than {limit} masked positions")


def check_special_ids(flat: dict, special: dict, where: str) -> None:
    """Special ids only where the format puts them (pipeline/shards/FORMAT.md, "Special tokens").

    ``[CLS]`` at position 0, ``[SEP]`` at the end of A and of B, and no special id
    anywhere else except ``[UNK]`` (a word not in the vocab) and at masked positions,
    whose input is ``[MASK]`` or a random id (any id, as Google draws it). Masked
    positions are never a ``[CLS]``/``[SEP]`` slot and their targets are text: no
    special id but ``[UNK]``. Text is text: a literal ``[MASK]`` in the corpus is
    tokenized as ``[``, ``mask``, ``]``, so a special id in the middle of a row is a
    writer's bug (or a tokenizer that treated the text as special).

    Args:
        flat: ``{list column: (values, offsets int64 [R + 1])}`` of checked rows.
        special: the manifest's ``vocab.special_ids`` (``pad unk cls sep mask``).
        where: the shard's path, for the message.

    Raises:
        ShardFormatError: ``"{where}: row {r} ..."``, the first bad row of the first check
            that fails.
    """
    ids, offsets = flat["input_ids"]
    segments, _ = flat["segment_ids"]
    positions, mlm_offsets = flat["masked_lm_positions"]
    targets, _ = flat["masked_lm_ids"]
    num_rows = len(offsets) - 1
    # Flat index of each slot the format fills: row starts ([CLS]), row ends and the
    # last segment-0 position before a segment-1 one in the same row ([SEP]).
    cls_slots = offsets[:-1]
    a_ends = np.flatnonzero(np.diff(segments.astype(np.int8)) > 0)
    a_ends = a_ends[~np.isin(a_ends + 1, offsets)]
    sep_slots = np.union1d(offsets[1:] - 1, a_ends)
    masked_rows = np.repeat(np.arange(num_rows), np.diff(mlm_offsets))
    masked = offsets[masked_rows] + positions.astype(np.int64)
    slots = np.zeros(len(ids), dtype=bool)
    slots[cls_slots] = slots[sep_slots] = True
    on_slot = slots[masked]
    _first_bad_value(on_slot, masked, offsets, where, "masks position {p}, a [CLS]/[SEP] slot")
    _first_bad(ids[cls_slots] != special["cls"], where, "does not start with [CLS]")
    _first_bad(ids[offsets[1:] - 1] != special["sep"], where, "does not end with [SEP]")
    _first_bad_value(ids[a_ends] != special["sep"], a_ends, offsets, where,
                     "has no [SEP] at position {p}, the end of segment A")  # fmt: skip
    names = {special[name]: f"[{name.upper()}]" for name in ("pad", "cls", "sep", "mask")}
    free = ~slots
    free[masked] = False  # a masked position's input may be any id
    text = np.flatnonzero(free)
    bad = np.isin(ids[text], list(names))
    if bad.any():
        token = names[int(ids[text[bad.argmax()]])]
        _first_bad_value(bad, text, offsets, where,
                         f"has {token} at position {{p}}, where the format allows none")  # fmt: skip
    bad = np.isin(targets, list(names))
    if bad.any():
        token = names[int(targets[bad.argmax()])]
        _first_bad_value(bad, masked, offsets, where,
                         f"masks a {token} at position {{p}}; a target is text, never special "
                         "but [UNK]")  # fmt: skip


def _first_bad_value(bad: np.ndarray, index: np.ndarray, offsets: np.ndarray, where: str,
                     what: str) -> None:  # fmt: skip
    """Raise for the first true ``bad``, a value at flat ``index`` (``{p}`` in ``what``:
    its position in its row)."""
    hits = np.flatnonzero(bad)
    if hits.size:
        flat_index = int(index[hits[0]])
        row = int(np.searchsorted(offsets, flat_index, side="right")) - 1
        what = what.format(p=flat_index - int(offsets[row]))
        raise shard_format.ShardFormatError(f"{where}: row {row} {what}")


def _first_bad(bad: np.ndarray, where: str, what: str) -> None:
    rows = np.flatnonzero(bad)
    if rows.size:
        raise shard_format.ShardFormatError(f"{where}: row {int(rows[0])} {what}")


def validate(directory: str) -> dict:
    """Verify ``directory`` (files and rows); returns the manifest.

    Raises:
        ShardFormatError: names the bad file and the problem.
        OSError: a file cannot be read.
    """
    manifest = shard_format.verify_directory(directory)
    for entry in manifest["shards"]:
        path = shard_format.join_path(directory, entry["name"])
        check_rows(shard_format.open_shard(path), manifest, path)
    return manifest
