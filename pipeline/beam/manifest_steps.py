"""The build's last steps: the vocab files, then the empty shards and the manifest.

``vocab.txt`` and ``tokenizer.json`` are written as soon as the vocab is known; the
manifest is written last, once every shard is (a directory with a manifest is a finished
build), with the statistics summed from the shards' and the counts of what was skipped
or noted on the way. Part of ``python -m pipeline build`` (``WriteVocab`` and
``WriteManifest`` in ``pipeline/beam/build.py``).
"""

from __future__ import annotations

import numpy as np
from apache_beam.io.filesystems import FileSystems

from pipeline.beam.config import BuildConfig
from pipeline.beam.shard_steps import merge_stats, remove_leftovers, write_atomic, write_shard
from pipeline.core.rows import RowBlock
from pipeline.core.segment import segmenter_version
from pipeline.core.vocab import build_tokenizer, special_ids, vocab_text
from pipeline.shards import shard_format, shard_writer


def summary_stats(stats: dict, documents: int, max_seq_length: int) -> dict:
    """Totals plus the shares a practitioner checks against Google's: random-next about 0.5,
    short rows about short_seq_prob, masks about masked_lm_prob of the real tokens, 80% [MASK].
    MLM rows (their stats count ``special_tokens``) have no random-next share but a packing
    efficiency: the share of their rows' slots (``rows * max_seq_length``) holding a token."""
    rows, masked = max(stats.get("rows", 0), 1), max(stats.get("masked", 0), 1)
    if "special_tokens" in stats:
        real = max(stats.get("tokens", 0) - stats["special_tokens"], 1)
        extra = {"packing_efficiency": round(stats.get("tokens", 0) / (rows * max_seq_length), 6)}
    else:
        real = max(stats.get("tokens", 0) - 3 * stats.get("rows", 0), 1)
        extra = {"random_next_share": round(stats.get("random_next", 0) / rows, 6)}
    return {
        **stats,
        **extra,
        "documents": documents,
        "short_row_share": round(1 - stats.get("full_length_rows", 0) / rows, 6),
        "masks_per_row": round(stats.get("masked", 0) / rows, 6),
        "masked_share_of_real_tokens": round(stats.get("masked", 0) / real, 6),
        "mask_token_share": round(stats.get("masked_as_mask", 0) / masked, 6),
        "kept_share": round(stats.get("masked_kept", 0) / masked, 6),
    }


def vocab_entry(vocab: list[str], config: BuildConfig) -> dict:
    """Write vocab.txt and tokenizer.json; return the manifest's ``vocab`` entry."""
    vocab_bytes = vocab_text(vocab).encode("utf-8")
    tokenizer_bytes = build_tokenizer(vocab, config.do_lower_case).to_str().encode("utf-8")
    _, vocab_sha256 = write_atomic(
        FileSystems.join(config.output, shard_format.VOCAB_NAME), vocab_bytes
    )
    _, tokenizer_sha256 = write_atomic(
        FileSystems.join(config.output, shard_format.TOKENIZER_NAME), tokenizer_bytes
    )
    ids = special_ids(vocab)
    return {
        "file": shard_format.VOCAB_NAME,
        "sha256": vocab_sha256,
        "size": len(vocab),
        "do_lower_case": config.do_lower_case,
        "special_ids": {name.removesuffix("_id"): i for name, i in ids.items()},
        "tokenizer_file": shard_format.TOKENIZER_NAME,
        "tokenizer_sha256": tokenizer_sha256,
    }


def write_manifest(
    shards: list[dict],
    vocab: list[str],
    vocab_info: dict,
    counts: dict,
    documents: int,
    buckets: dict,
    config: BuildConfig,
    num_shards: int,
) -> dict:
    """Write the shards no row landed in (empty, so the set of files is always
    complete), remove the part files (only now: a retried join still finds its
    parts) and killed writers' temporary files, then write the manifest, last."""
    remove_leftovers(config.output)
    written = {s["entry"]["name"] for s in shards}
    for index in range(num_shards):
        if shard_format.shard_name(index, num_shards) not in written:
            shards = [*shards, write_shard(index, RowBlock.empty(), vocab, config, num_shards)]
    skipped = {kind: n for (group, kind), n in counts.items() if group == "skipped"}
    noticed = {kind: n for (group, kind), n in counts.items() if group == "input"}
    stats = {
        **summary_stats(merge_stats(s["stats"] for s in shards), documents, config.max_seq_length),
        "buckets": buckets,
        "input": dict(sorted(noticed.items())),
    }
    if config.curating:  # only then: builds without curation keep the manifests they had
        removed = {kind: n for (group, kind), n in counts.items() if group == "removed"}
        stats["curation"] = {
            "removed": dict(sorted(removed.items())),
            "components_changed_in_last_round": counts.get(
                ("curation", "components_changed_in_last_round"), 0
            ),
        }
    if config.capped_rate:  # rows whose prediction count the cap lowered (by their length)
        wanted = config.uncapped_predictions()
        histogram = np.asarray(stats["length_histogram"])
        stats["rows_capped"] = int(histogram[wanted > config.max_predictions_per_seq].sum())
    params = {**config.params(), "num_shards": num_shards}
    if config.wwm_segmenter != "none":  # the words, so the masks, depend on its version
        params["wwm_segmenter_version"] = segmenter_version(config.wwm_segmenter)
    manifest = shard_writer.build_manifest(
        shards=[s["entry"] for s in shards],
        vocab=vocab_info,
        params=params,
        stats=stats,
        skipped=dict(sorted(skipped.items())),
    )
    path = FileSystems.join(config.output, shard_format.MANIFEST_NAME)
    write_atomic(path, shard_writer.encode_manifest(manifest))
    return manifest
