"""``python -m pipeline validate DIR`` and ``python -m pipeline inspect DIR -n 5``.

``validate`` checks a build the way a trainer relies on it (pipeline/shards/validate.py)
and exits 1 naming the first bad file and what is wrong, 0 when all is well.

``inspect`` decodes rows back to WordPieces, as the model sees them, with the masks
shown: a masked position reads ``[input>target]``, e.g. ``[[MASK]>river]``
(replaced by ``[MASK]``), ``[lake>river]`` (a random id) or ``[river>river]``
(kept). Masking is per WordPiece, so a word may be partly masked:
``ri [[MASK]>##ver]``. ``--words`` joins ``##`` pieces to the piece before them
for easier reading (``ri ##ver`` -> ``river``), except at masked positions; MLM rows
join where their ``continues_word`` says (a segmenter's Chinese words too).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pipeline.options import CommandParser
from pipeline.shards import shard_format
from pipeline.shards.validate import validate


def decode_row(row: dict, vocab: Sequence[str], *, words: bool = False) -> str:
    """One row as text: its WordPieces separated by spaces, masks as ``[input>target]``.

    Args:
        row: ``input_ids``, with ``masked_lm_positions``, ``masked_lm_ids`` (1-D int
            arrays) where the rows are masked, ``continues_word`` (bool) for MLM rows.
        vocab: token strings by id.
        words: join each ``##`` piece (for MLM rows: each token ``continues_word`` marks)
            to the piece before it, unless either is masked.

    Example: ``[CLS] the ri ##ver [MASK] [SEP]`` with position 4 masked (target
    ``flows``) -> ``"[CLS] the ri ##ver [[MASK]>flows] [SEP]"``, or with ``words``
    ``"[CLS] the river [[MASK]>flows] [SEP]"``.
    """
    targets = {}
    if "masked_lm_positions" in row:
        targets = dict(
            zip(row["masked_lm_positions"].tolist(), row["masked_lm_ids"].tolist(), strict=True)
        )
    ids = row["input_ids"].tolist()
    continues = row.get("continues_word")
    if continues is None:
        continues = [vocab[token].startswith("##") for token in ids]
    pieces: list[str] = []
    joinable = False  # whether a ## piece may join pieces[-1] (one that is not a mask)
    for position, token in enumerate(ids):
        text = vocab[token]
        if position in targets:
            pieces.append(f"[{text}>{vocab[targets[position]]}]")
        elif words and joinable and continues[position]:
            pieces[-1] += text.removeprefix("##")
        else:
            pieces.append(text)
        joinable = position not in targets
    return " ".join(pieces)


def inspect(directory: str, num_rows: int, shard: int, *, words: bool = False) -> list[str]:
    """The first ``num_rows`` rows of shard ``shard`` decoded (:func:`decode_row`), with a
    header line each."""
    manifest = shard_format.read_manifest(directory)
    shards = manifest["shards"]
    if not 0 <= shard < len(shards):
        raise ValueError(f"--shard {shard}: {directory} has shards 0..{len(shards) - 1}")
    vocab_path = shard_format.join_path(directory, manifest["vocab"]["file"])
    vocab = shard_format.read_bytes(vocab_path).decode("utf-8").splitlines()
    table = shard_format.open_shard(shard_format.join_path(directory, shards[shard]["name"]))
    lines = []
    for index in range(min(num_rows, table.num_rows)):
        row = shard_format.row_to_numpy(table, index)
        masked = len(row.get("masked_lm_ids", ()))
        if "next_sentence_label" in row:
            shape = "B is random" if row["next_sentence_label"] else "B follows A"
        else:  # MLM rows: [SEP]s at the end and between the documents it packs
            sep = manifest["vocab"]["special_ids"]["sep"]
            inner = row["input_ids"][1:-1] == sep
            if masked:
                inner[row["masked_lm_positions"][row["masked_lm_positions"] > 0] - 1] = False
            shape = f"{int(inner.sum()) + 1} document(s), no next-sentence label"
        lines.append(
            f"--- {shards[shard]['name']} row {index}: {len(row['input_ids'])} "
            f"tokens, {masked} masked, {shape}"
        )
        lines.append(decode_row(row, vocab, words=words))
    return lines


def _parser(command: str) -> CommandParser:
    """``python -m pipeline COMMAND``'s parser, its one positional the shard directory."""
    p = CommandParser.of_doc(f"python -m pipeline {command}", __doc__)
    p.add_argument("directory", help="a build's output directory (local or a URI)")
    return p


def validate_main(argv: Sequence[str]) -> int:
    p = _parser("validate")
    args = p.parse_args(argv)
    try:
        manifest = validate(args.directory)
    except (shard_format.ShardFormatError, OSError) as err:
        print(f"INVALID: {err}", file=sys.stderr)
        return 1
    print(
        f"OK: {len(manifest['shards'])} shard(s), {manifest['num_rows']} rows checked "
        f"in {os.fspath(args.directory)}"
    )
    return 0


def inspect_main(argv: Sequence[str]) -> int:
    p = _parser("inspect")
    p.add_argument("-n", "--num_rows", type=int, default=5, help="rows to show (default: 5)")
    p.add_argument("--shard", type=int, default=0, help="shard index (default: 0)")
    p.add_argument(
        "--words",
        action="store_true",
        help="join ## pieces into words (masked pieces stay apart); "
        "default: every WordPiece on its own, as masked",
    )
    args = p.parse_args(argv)
    try:
        lines = inspect(args.directory, args.num_rows, args.shard, words=args.words)
    except (shard_format.ShardFormatError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0
