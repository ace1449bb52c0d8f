"""Masking in the trainer: training rows re-masked at a rate, held-out MLM rows at one fixed rate.

Both apply Google's rules (pipeline/core/masking.py): ``round(n * rate)`` predictions in a
row of n tokens ([CLS] and [SEP] counted, never masked), each [MASK], kept or a random id
by the split (80/10/10 unless ``--mask-split`` says otherwise), optionally whole words.

- :class:`DynamicMasker`, training: ``--masking dynamic`` on shards with static masks (NSP or
  ``mlm_masked`` rows: the original ids are restored from ``masked_lm_ids`` first), and always
  on unmasked ``mlm`` rows. The rate is ``--mask-rate``, else the manifest's
  ``masked_lm_prob`` (else 0.15 for unmasked rows, which have none). A micro-batch's masks are
  drawn from ``numpy_rng(seed, "dynamic", p, B)`` (``p`` the stream position of its first row,
  ``B`` the micro batch): the same on resume and for any number of DataLoader workers, fresh
  each epoch.
- :class:`EvalMasker`, evaluation of held-out MLM rows (both MLM kinds; NSP held-out rows keep
  their static masks): ``--eval-mask-rate`` (0.15, as ModernBERT evaluates), 80/10/10, token
  by token, each row's masks a pure function of its ids and its index in the held-out
  manifest (``pipeline.core.masking.mask_flat`` keyed by ``splitmix64(base + row)``, ``base``
  from a constant seed). So every run, whatever its ``--seed``, ``--mask-rate``, batch size or
  number of ranks, is scored on the same masked positions.

Whole words: on MLM rows the groups are the rows' ``continues_word`` column (``##`` pieces
and a segmenter's Chinese words, FORMAT.md); on NSP rows Google's ``##`` rule (vocab.txt).
``--whole-word-mask`` unset follows the shards: the manifest's ``do_whole_word_mask``, and for
unmasked MLM rows true when they were built with a ``--wwm_segmenter``, else false.

trainer/loop.py builds them with :func:`masker_for` (training) and :func:`eval_masker_for`
(held-out rows); tests: ``python -m pytest tests/trainer/test_mlm_training.py``.

Prediction slots: with a rate of its own (``--mask-rate``, unmasked rows, evaluation) P is
``ceil(rate * max_seq_length)``, which no row reaches (``round(n * rate) <= ceil(rate *
max_seq_length)`` for n <= max_seq_length), so the rate is never capped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.core.masking import (
    GOOGLE_SPLIT,
    MaskingConfig,
    MaskingVocab,
    mask_flat,
    mask_instances,
)
from pipeline.core.rng import derive_seed, numpy_rng, splitmix64
from pipeline.core.vocab import parse_vocab
from pipeline.shards.shard_format import manifest_kind

from .config import TrainConfig
from .shards import ShardSet

logger = logging.getLogger(__name__)

DEFAULT_RATE = 0.15  # unmasked MLM rows without --mask-rate; Google's and RoBERTa's
EVAL_MASK_SEED = 0  # the held-out masks' seed: a constant, never --seed


def prediction_slots(rate: float, max_seq_length: int) -> int:
    """P = ceil(rate * max_seq_length), the float product rounded to 9 places first (so that
    0.1 * 30 gives 3, not 4). Example: ``(0.15, 128) -> 20``, ``(0.3, 128) -> 39``."""
    return max(1, math.ceil(round(rate * max_seq_length, 9)))


def default_whole_word(manifest: Mapping) -> bool:
    """Whole-word masking as the shards were built for it (module docstring)."""
    params = manifest["params"]
    if manifest_kind(manifest) == "mlm":
        return "wwm_segmenter" in params  # recorded only when a segmenter ran
    return bool(params.get("do_whole_word_mask", False))


def original_ids(row: Mapping[str, np.ndarray]) -> np.ndarray:
    """int32 (n,): a row's ids before masking (its static masks undone, where it has any)."""
    ids = row["input_ids"].astype(np.int32)  # a copy: the shard is read-only
    if "masked_lm_positions" in row:
        ids[row["masked_lm_positions"].astype(np.int64)] = row["masked_lm_ids"]
    return ids


@dataclass(frozen=True)
class MaskOptions:
    """How training rows are re-masked (trainer/config.py's --mask-rate, --mask-split,
    --whole-word-mask). None: as the shards say (module docstring)."""

    rate: float | None = None
    split: tuple[float, float, float] = GOOGLE_SPLIT
    whole_word: bool | None = None


class DynamicMasker:
    """Re-mask training rows (module docstring).

    Args:
        manifest: the shard directory's manifest (kind, params, vocab.special_ids).
        vocab_tokens: the tokens of vocab.txt; needed only for whole-word masking of NSP rows.
        options: rate, split, whole words (None: all as the shards say).

    Raises:
        ValueError: whole-word masking of NSP rows without ``vocab_tokens``.
    """

    def __init__(
        self,
        manifest: Mapping,
        vocab_tokens: Sequence[str] | None = None,
        options: MaskOptions | None = None,
    ):
        options = options or MaskOptions()
        params = manifest["params"]
        self.kind = manifest_kind(manifest)
        seq = int(manifest["schema"]["max_seq_length"])
        rate = options.rate
        if rate is None and self.kind == "mlm":
            rate = DEFAULT_RATE
        if rate is None:  # the shards' own rate and cap, as their static masks had
            rate, slots = float(params["masked_lm_prob"]), int(params["max_predictions_per_seq"])
        else:
            slots = prediction_slots(rate, seq)
        whole = default_whole_word(manifest) if options.whole_word is None else options.whole_word
        self.config = MaskingConfig(
            masked_lm_prob=rate,
            max_predictions_per_seq=slots,
            do_whole_word_mask=whole,
            mask_split=tuple(options.split),
        )
        self.rate, self.max_predictions = rate, slots
        self.word_units = "continues_word" if self.kind != "nsp" else "##"
        self.vocab = _masking_vocab(manifest, vocab_tokens, whole and self.kind == "nsp")

    def __call__(self, rows: list, gen: np.random.Generator) -> list:
        """Rows with new masks: the structure ShardSet.rows() returns, ({column: array}, label)."""
        originals = [original_ids(row) for row, _ in rows]
        joins = None
        if self.config.do_whole_word_mask and self.kind != "nsp":
            joins = [row["continues_word"] for row, _ in rows]
        masked = mask_instances(originals, self.config, self.vocab, gen, word_joins=joins)
        return [
            _with_masks(row, label, new) for (row, label), new in zip(rows, masked, strict=True)
        ]

    def mask_batch(self, rows: list, *, seed: int, position: int, micro: int, row_ids) -> list:
        """A micro-batch's rows, masked from its stream position (module docstring)."""
        del row_ids  # training masks follow the stream position: fresh each epoch
        return self(rows, numpy_rng(seed, "dynamic", position, micro))


class EvalMasker:
    """Mask held-out MLM rows at one fixed rate, the same in every run (module docstring).

    Args:
        manifest: the held-out directory's manifest.
        rate: --eval-mask-rate.
    """

    def __init__(self, manifest: Mapping, rate: float = DEFAULT_RATE):
        seq = int(manifest["schema"]["max_seq_length"])
        self.rate, self.max_predictions = rate, prediction_slots(rate, seq)
        self.config = MaskingConfig(
            masked_lm_prob=rate, max_predictions_per_seq=self.max_predictions
        )
        self.vocab = _masking_vocab(manifest, None, False)
        self._base = np.uint64(derive_seed("eval_masks", EVAL_MASK_SEED))

    def mask_batch(self, rows: list, *, row_ids: np.ndarray, **_) -> list:
        """Rows masked as a function of their ids and ``row_ids`` (int (B,), manifest order)."""
        originals = [original_ids(row) for row, _ in rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(ids) for ids in originals], out=offsets[1:])
        with np.errstate(over="ignore"):
            keys = splitmix64(self._base + np.asarray(row_ids, dtype=np.uint64))
        flat = np.concatenate(originals)
        masked, selected = mask_flat(flat, offsets, keys, self.config, self.vocab)
        bounds = np.searchsorted(selected, offsets).tolist()
        out = []
        for r, (row, label) in enumerate(rows):
            start, end = offsets[r], offsets[r + 1]
            chosen = selected[bounds[r] : bounds[r + 1]]
            out.append(
                (
                    {
                        **row,
                        "input_ids": masked[start:end],
                        "masked_lm_positions": (chosen - start).astype(np.int32),
                        "masked_lm_ids": flat[chosen],
                    },
                    label,
                )
            )
        return out


def masker_for(shards: ShardSet, config: TrainConfig) -> DynamicMasker | None:
    """A DynamicMasker for ``--masking dynamic`` and for unmasked MLM shards, at --mask-rate
    (trainer/masking.py); reads vocab.txt for whole-word masking of NSP rows.

    Raises:
        ValueError: --mask-rate, --mask-split or --whole-word-mask on shards whose static
            masks are used (naming the flag and --masking dynamic).
    """
    dynamic = config.masking == "dynamic" or shards.kind == "mlm"
    split = config.mask_shares
    if not dynamic:
        given = [
            flag
            for flag, set_ in (
                ("--mask-rate", config.mask_rate is not None),
                ("--mask-split", split != GOOGLE_SPLIT),
                ("--whole-word-mask", config.whole_word_mask is not None),
            )
            if set_
        ]
        if given:
            raise ValueError(
                f"{' '.join(given)} shape dynamic masks, and --data {shards.directory} has "
                f"static masks ({shards.kind} rows) used as they are: add --masking dynamic"
            )
        return None
    options = MaskOptions(config.mask_rate, split, config.whole_word_mask)
    tokens = None
    whole = (
        default_whole_word(shards.manifest) if options.whole_word is None else options.whole_word
    )
    if whole and shards.kind == "nsp":  # "##" pieces; MLM rows carry their word units
        name = shards.manifest["vocab"]["file"]
        tokens = parse_vocab(shards.read_text(name), f"{shards.directory}/{name}")
    masker = DynamicMasker(shards.manifest, tokens, options)
    logger.info(
        "dynamic masking of %s rows: rate %g (%d prediction slots), split %s, whole words %s",
        shards.kind,
        masker.rate,
        masker.max_predictions,
        config.mask_split,
        f"on ({masker.word_units})" if whole else "off",
    )
    return masker


def eval_masker_for(shards: ShardSet, config: TrainConfig) -> EvalMasker | None:
    """Held-out MLM rows' masker at --eval-mask-rate (trainer/masking.py); None for NSP rows,
    which keep their static masks."""
    if shards.trains_nsp:
        return None
    return EvalMasker(shards.manifest, config.eval_mask_rate)


def _masking_vocab(manifest: Mapping, tokens: Sequence[str] | None, pieces: bool) -> MaskingVocab:
    """The vocab masking needs; ``pieces``: with the ``##`` flags of vocab.txt (NSP whole
    words). MLM rows' whole words come from their column: no flags, none needed.

    Raises:
        ValueError: ``pieces`` without ``tokens``.
    """
    if tokens is not None and pieces:
        return MaskingVocab.from_tokens(tokens)
    if pieces:
        raise ValueError("whole-word masking needs the vocabulary (vocab.txt)")
    special, size = manifest["vocab"]["special_ids"], int(manifest["vocab"]["size"])
    return MaskingVocab(
        cls_id=special["cls"],
        sep_id=special["sep"],
        mask_id=special["mask"],
        vocab_size=size,
        is_continuation=np.zeros(size, dtype=bool),  # for whole words by word_joins alone
    )


def _with_masks(row: Mapping, label: int, new) -> tuple[dict, int]:
    out = dict(row)
    out["input_ids"] = new.input_ids
    out["masked_lm_positions"] = new.masked_lm_positions
    out["masked_lm_ids"] = new.masked_lm_ids
    return out, label
