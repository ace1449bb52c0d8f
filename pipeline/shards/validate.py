"""The row rule of the shard format, and the validator that checks a directory against it.

:func:`check_rows` is the one definition of a valid row: ids in the vocab, rows of 1 to
``max_seq_length`` ids, segment ids 0/1, masked positions inside the row and increasing,
at most ``max_predictions_per_seq`` of them, labels 0/1 and, given the vocab's special
ids, the layout (``[CLS] A [SEP] B [SEP]``, segment ids 0 then 1, special ids only where
the format puts them). The writer (``shard_writer.encode_shard``) calls it before writing,
:func:`validate` on every shard read back, and the trainer's ``collate`` (trainer/data.py)
calls its value and count parts (:func:`check_values`, :func:`check_predictions`) on
every batch. ``python -m pipeline validate DIR`` runs :func:`validate`
(pipeline/cli/inspect_cli.py): the first problem raises ShardFormatError naming the file
and the row.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from pipeline.shards import shard_format


def check_rows(
    flat: Mapping[str, tuple[np.ndarray, np.ndarray]],
    labels: np.ndarray | None,
    *,
    vocab_size: int,
    max_seq_length: int,
    max_predictions: int | None = None,
    special_ids: Mapping[str, int] | None = None,
    kind: str = "nsp",
) -> None:
    """Check rows given flat against the format's rules (module docstring).

    Args:
        flat: ``{list column: (values (total,) any int dtype, offsets int64 (R + 1,))}``,
            row ``r`` of a column being ``values[offsets[r]:offsets[r + 1]]``: the list
            columns of ``kind`` (``shard_format.KIND_COLUMNS``).
        labels: int (R,), next_sentence_label; None for the MLM kinds, which have none.
        vocab_size: the schema's; ids must be below it.
        max_seq_length: the schema's; the longest row allowed.
        max_predictions: the manifest's ``max_predictions_per_seq``; None skips the count.
        special_ids: the manifest's ``vocab.special_ids`` (``pad unk cls sep mask``): also
            check the layout; None (the writer, which knows no vocab) skips it.
        kind: the row kind. MLM rows have segment ids 0 throughout (not stored), no label,
            ``[SEP]`` between the documents a row packs, and ``continues_word`` (one flag
            per id, False at ``[CLS]``/``[SEP]``).

    Raises:
        ValueError: the first bad row, naming the column and the row.
    """
    words = flat.get("continues_word")
    flat, labels = _as_nsp_columns(flat, labels, kind)
    offsets = flat["input_ids"][1]
    lengths = np.diff(offsets)
    _require(lengths >= 1, offsets, "input_ids", "is empty")
    _require(lengths <= max_seq_length, offsets, "input_ids", f"is longer than {max_seq_length=}")
    for name, other in (("segment_ids", "input_ids"), ("masked_lm_ids", "masked_lm_positions")):
        bad = np.flatnonzero(np.diff(flat[name][1]) != np.diff(flat[other][1]))
        if bad.size:
            raise ValueError(f"{name}: row {bad[0]} has a different length than its {other}")
    positions, position_offsets = flat["masked_lm_positions"]
    counts = np.diff(position_offsets)
    if max_predictions is not None:
        check_predictions(counts, max_predictions)
    values = {name: flat[name][0] for name in shard_format.LIST_COLUMNS}
    check_values(
        {**values, "next_sentence_label": labels},
        vocab_size=vocab_size,
        row_length=np.repeat(lengths, counts),
        offsets={name: flat[name][1] for name in shard_format.LIST_COLUMNS},
    )
    _check_increasing(positions, position_offsets)
    if special_ids is not None and len(lengths):
        _check_layout(flat, special_ids, packed=kind != "nsp")
        if words is not None:
            _check_word_flags(words[0], flat, special_ids)


def _check_increasing(positions: np.ndarray, position_offsets: np.ndarray) -> None:
    """Each row's masked positions strictly increase."""
    counts = np.diff(position_offsets)
    increasing = np.ones(positions.size, dtype=bool)
    increasing[1:] = positions[1:] > positions[:-1]
    increasing[position_offsets[:-1][counts > 0]] = True  # row starts
    bad = np.flatnonzero(~increasing)
    if bad.size:
        row = int(np.searchsorted(position_offsets, bad[0], side="right")) - 1
        raise ValueError(
            f"masked_lm_positions: row {row} has value {positions[bad[0]]} not increasing"
        )


def _check_word_flags(words: np.ndarray, flat: Mapping, special_ids: Mapping[str, int]) -> None:
    """``continues_word`` is false at every [CLS] and [SEP] (a masked position's input may
    be any id, so it is not taken for one)."""
    ids, offsets = flat["input_ids"]
    special = ids == special_ids["sep"]
    positions, mlm_offsets = flat["masked_lm_positions"]
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(mlm_offsets))
    special[offsets[rows] + positions.astype(np.int64)] = False  # any id, masked
    special[offsets[:-1]] = special[offsets[1:] - 1] = True
    _first_bad_value(
        words.astype(bool) & special,
        np.arange(len(ids)),
        offsets,
        "has continues_word true at position {p}, a [CLS]/[SEP]",
    )


def _as_nsp_columns(flat: Mapping, labels: np.ndarray | None, kind: str) -> tuple[dict, np.ndarray]:
    """An MLM kind's columns with the NSP columns it lacks filled in as the format defines
    them (segment ids 0, no masks, label 0), so one rule checks every kind; for NSP rows,
    ``flat`` and ``labels`` as they are."""
    names = set(shard_format.kind_columns(kind)) - {"next_sentence_label"}
    if set(flat) != names:
        raise ValueError(f"{kind} rows have the columns {sorted(names)}, got {sorted(flat)}")
    if kind == "nsp":
        return dict(flat), labels
    ids, offsets = flat["input_ids"]
    word_offsets = flat["continues_word"][1]
    bad = np.flatnonzero(np.diff(word_offsets) != np.diff(offsets))
    if bad.size:
        raise ValueError(f"continues_word: row {bad[0]} has a different length than its input_ids")
    out = dict(flat)
    out.pop("continues_word")
    out["segment_ids"] = (np.zeros(len(ids), dtype=np.uint8), offsets)
    none = (np.zeros(0, dtype=np.int64), np.zeros(len(offsets), dtype=np.int64))
    out.setdefault("masked_lm_positions", none)
    out.setdefault("masked_lm_ids", none)
    return out, np.zeros(len(offsets) - 1, dtype=np.int64)


def check_values(
    values: Mapping[str, np.ndarray],
    *,
    vocab_size: int | None,
    row_length: np.ndarray,
    offsets: Mapping[str, np.ndarray] | None = None,
    rows_of: str = "",
) -> None:
    """Every value in its column's range: ``input_ids`` and ``masked_lm_ids`` in
    [0, vocab_size), ``segment_ids`` and ``next_sentence_label`` in [0, 2),
    ``masked_lm_positions`` in [0, the row's length). Two reductions per column when
    all is well (the trainer calls this on every batch).

    Args:
        values: ``{column: int array}`` for the five columns, each either flat (total,)
            with its ``offsets`` (R + 1,), or one row per first index: padded (B, W), or
            (B,) for the label (then it has no entry in ``offsets``).
        vocab_size: None skips the two id columns.
        row_length: int, shaped like ``values["masked_lm_positions"]`` or broadcasting to
            it (e.g. (B, 1)): the length of each position's row.
        offsets: ``{list column: offsets}`` of the flat columns.
        rows_of: what the rows belong to in the message ("the batch"); "" says nothing.

    Raises:
        ValueError: ``"segment_ids values must be in [0, 2), got 255 in row 3 of the
            batch"``, for the first value out of range.
    """
    limits = (
        ("input_ids", vocab_size, ""),
        ("segment_ids", 2, ""),
        ("masked_lm_positions", row_length, " (the row's length)"),
        ("masked_lm_ids", vocab_size, ""),
        ("next_sentence_label", 2, ""),
    )
    for name, upper, what in limits:
        if upper is None:
            continue
        column = values[name]
        if not column.size:
            continue
        if np.isscalar(upper):
            if column.min() >= 0 and column.max() < upper:  # no temporary arrays
                continue
        elif ((column >= 0) & (column < upper)).all():
            continue
        index = int(np.flatnonzero((column < 0) | (column >= upper))[0])
        limit = int(np.broadcast_to(upper, column.shape).flat[index])
        starts = (offsets or {}).get(name)
        if starts is None:
            row = int(np.unravel_index(index, column.shape)[0])
        else:
            row = int(np.searchsorted(starts, index, side="right")) - 1
        raise ValueError(
            f"{name} values must be in [0, {limit}{what}), got {column.flat[index]} in "
            f"row {row}{_of(rows_of)}"
        )


def check_predictions(counts: np.ndarray, max_predictions: int, *, rows_of: str = "") -> None:
    """At most ``max_predictions`` masked positions per row.

    Args:
        counts: int (R,), each row's number of masked positions.
        max_predictions: the manifest's ``max_predictions_per_seq``.
        rows_of: as :func:`check_values`.

    Raises:
        ValueError: naming the first row with more.
    """
    bad = np.flatnonzero(np.asarray(counts) > max_predictions)
    if bad.size:
        raise ValueError(
            f"masked_lm_positions: row {bad[0]}{_of(rows_of)} has {counts[bad[0]]} masked "
            f"positions, more than max_predictions_per_seq {max_predictions}"
        )


def _of(rows_of: str) -> str:
    return f" of {rows_of}" if rows_of else ""


def _require(ok: np.ndarray, offsets: np.ndarray, name: str, what: str) -> None:
    bad = np.flatnonzero(~ok)
    if bad.size:
        raise ValueError(
            f"{name}: row {bad[0]} {what} (length {offsets[bad[0] + 1] - offsets[bad[0]]})"
        )


def table_columns(table: pa.Table) -> tuple[dict, np.ndarray | None]:
    """A shard table as :func:`check_rows` takes it: ``({list column: (values, offsets
    int64)}, labels int64, or None for the MLM kinds)``."""
    flat = {}
    for name in table.column_names:
        if name == "next_sentence_label":
            continue
        column = table.column(name).combine_chunks()
        offsets = column.offsets.to_numpy()
        values = column.flatten()
        if pa.types.is_boolean(values.type):
            values = values.to_numpy(zero_copy_only=False)
        else:
            values = values.to_numpy().astype(np.int64)
        flat[name] = (values, (offsets - offsets[0]).astype(np.int64))
    labels = None
    if "next_sentence_label" in table.column_names:
        labels = table.column("next_sentence_label").to_numpy().astype(np.int64)
    return flat, labels


def check_shard_rows(table: pa.Table, manifest: Mapping, where: str) -> None:
    """:func:`check_rows` on one shard read back, with the manifest's parameters.

    Raises:
        ShardFormatError: the first bad row, named with ``where``.
    """
    flat, labels = table_columns(table)
    try:
        check_rows(
            flat,
            labels,
            vocab_size=manifest["schema"]["vocab_size"],
            max_seq_length=manifest["schema"]["max_seq_length"],
            max_predictions=manifest["params"].get("max_predictions_per_seq"),
            special_ids=manifest["vocab"]["special_ids"],
            kind=shard_format.manifest_kind(manifest),
        )
    except ValueError as err:
        raise shard_format.ShardFormatError(f"{where}: {err}") from None


def _check_layout(flat: Mapping, special: Mapping[str, int], packed: bool = False) -> None:
    """Segment ids 0 then 1, and special ids only where the format puts them
    (pipeline/shards/FORMAT.md, "Special tokens").

    ``[CLS]`` at position 0, ``[SEP]`` at the end of A and of B, and no special id
    anywhere else except ``[UNK]`` (a word not in the vocab) and at masked positions,
    whose input is ``[MASK]`` or a random id (any id, as Google draws it). Masked
    positions are never a ``[CLS]``/``[SEP]`` slot and their targets are text: no
    special id but ``[UNK]``. Text is text: a literal ``[MASK]`` in the corpus is
    tokenized as ``[``, ``mask``, ``]``, so a special id in the middle of a row is a
    writer's bug (or a tokenizer that treated the text as special).

    Args:
        flat: ``{list column: (values, offsets int64 [R + 1])}`` of rows whose values
            and lengths are checked (at least one row).
        special: the manifest's ``vocab.special_ids`` (``pad unk cls sep mask``).
        packed: MLM rows: one segment, and a ``[SEP]`` wherever one document ends and
            the next begins (an unmasked ``[SEP]`` inside the row is such a slot).

    Raises:
        ValueError: ``"row {r} ..."``, the first bad row of the first check that fails.
    """
    ids, offsets = flat["input_ids"]
    segments, _ = flat["segment_ids"]
    _check_segments(segments, offsets)
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
    if packed:
        inner = np.flatnonzero(ids == special["sep"])
        sep_slots = np.union1d(sep_slots, np.setdiff1d(inner, masked))
    slots = np.zeros(len(ids), dtype=bool)
    slots[cls_slots] = slots[sep_slots] = True
    on_slot = slots[masked]
    _first_bad_value(on_slot, masked, offsets, "masks position {p}, a [CLS]/[SEP] slot")
    _first_bad(ids[cls_slots] != special["cls"], "does not start with [CLS]")
    _first_bad(ids[offsets[1:] - 1] != special["sep"], "does not end with [SEP]")
    _first_bad_value(
        ids[a_ends] != special["sep"],
        a_ends,
        offsets,
        "has no [SEP] at position {p}, the end of segment A",
    )
    _check_text(ids, targets, slots, masked, offsets, special)


def _check_segments(segments: np.ndarray, offsets: np.ndarray) -> None:
    """Segment ids never step down within a row: 0 ... 0 1 ... 1."""
    step_down = np.flatnonzero(np.diff(segments.astype(np.int8)) < 0) + 1
    inside = ~np.isin(step_down, offsets)
    if inside.any():
        row = int(np.searchsorted(offsets, step_down[inside][0], side="right")) - 1
        raise ValueError(f"row {row} has segment ids 1 then 0")


def _check_text(ids, targets, slots, masked, offsets, special: Mapping[str, int]) -> None:
    """No [PAD], [CLS], [SEP] or [MASK] id outside the format's ``slots`` and the
    ``masked`` positions (whose input may be any id), nor as a masked position's target."""
    names = {special[name]: f"[{name.upper()}]" for name in ("pad", "cls", "sep", "mask")}
    free = ~slots
    free[masked] = False  # a masked position's input may be any id
    text = np.flatnonzero(free)
    bad = np.isin(ids[text], list(names))
    if bad.any():
        token = names[int(ids[text[bad.argmax()]])]
        _first_bad_value(
            bad, text, offsets, f"has {token} at position {{p}}, where the format allows none"
        )
    bad = np.isin(targets, list(names))
    if bad.any():
        token = names[int(targets[bad.argmax()])]
        _first_bad_value(
            bad,
            masked,
            offsets,
            f"masks a {token} at position {{p}}; a target is text, never special but [UNK]",
        )


def _first_bad_value(bad: np.ndarray, index: np.ndarray, offsets: np.ndarray, what: str) -> None:
    """Raise for the first true ``bad``, a value at flat ``index`` (``{p}`` in ``what``:
    its position in its row)."""
    hits = np.flatnonzero(bad)
    if hits.size:
        flat_index = int(index[hits[0]])
        row = int(np.searchsorted(offsets, flat_index, side="right")) - 1
        what = what.format(p=flat_index - int(offsets[row]))
        raise ValueError(f"row {row} {what}")


def _first_bad(bad: np.ndarray, what: str) -> None:
    rows = np.flatnonzero(bad)
    if rows.size:
        raise ValueError(f"row {int(rows[0])} {what}")


def validate(directory: str) -> dict:
    """Verify ``directory`` (files and rows); returns the manifest.

    Raises:
        ShardFormatError: names the bad file and the problem.
        OSError: a file cannot be read.
    """
    manifest = shard_format.verify_directory(directory)
    for entry in manifest["shards"]:
        path = shard_format.join_path(directory, entry["name"])
        check_shard_rows(shard_format.open_shard(path), manifest, path)
    return manifest
