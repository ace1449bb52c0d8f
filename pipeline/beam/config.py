"""Options of ``python -m pipeline build``: one validated config, Google's flag names.

Our flags are parsed with ``parse_known_args``; everything else on the command line
(``--runner``, ``--direct_num_workers``, ``--temp_location``, ``--setup_file``, ...)
goes to Beam untouched. ``--config FILE`` takes a JSON object of the same settings keyed
by these names (``{"dupe_factor": 5, "input": ["wiki/*.txt"]}``); flags override it.
Each flag takes hyphens too (``--dupe-factor``), and so does each of Beam's.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.beam import memory
from pipeline.core.packing import PACKINGS
from pipeline.core.segment import SEGMENTERS
from pipeline.options import CommandParser, add_options, option, parse_options

INPUT_FORMATS = ("auto", "txt", "jsonl", "parquet")
OBJECTIVES = ("nsp", "mlm")
SPOOL = ("auto", "yes", "no")  # --spool (pipeline/beam/spool.py), build's and curate's
# Shards aim at this many bytes when --num_shards is not given (64-256 MB window): a
# default of the output, for the trainer's reads (a few files per rank, each read in
# record batches), not a memory bound: a shard of any size is written one range at a
# time (pipeline/beam/memory.py, RANGE_BYTES).
TARGET_SHARD_BYTES = 128 * 2**20
# Output bytes per input byte and dupe pass, measured on English text at seq 128
# (uint16 ids + uint8 segments + masks + Arrow offsets); only sizes the shard count.
OUTPUT_BYTES_PER_INPUT_BYTE = 0.9


class ReadOptions(NamedTuple):
    """How records become documents: ``input_format`` (txt, jsonl, parquet, or auto: each
    file's name or first bytes) and the jsonl field or parquet column of the text."""

    input_format: str = "auto"
    text_field: str = "text"


DEDUP = ("none", "exact", "minhash")
DEDUP_HELP = "minhash: near and exact copies; exact: exact copies; none"
# Which document of a near-duplicate cluster stays (pipeline/beam/curation_steps.py).
MINHASH_KEEP = ("smallest_id", "first")


@dataclass(frozen=True, kw_only=True)
class CurationOptions:
    """The curation steps' options (pipeline/beam/curation_steps.py), the same flags in
    ``python -m pipeline curate`` and ``build``; nothing is removed by default in
    ``build`` (``curate`` dedups with MinHash by default)."""

    dedup: str = option("none", DEDUP_HELP, choices=DEDUP)
    minhash_ngram: int = option(5, "MinHash: words per shingle")
    minhash_bands: int = option(14, "MinHash LSH bands (datatrove's default)")
    minhash_rows: int = option(8, "MinHash LSH rows per band (datatrove's default)")
    minhash_seed: int = option(1, "seed of MinHash's hash functions")
    # smallest_id: the same kept set whatever the files' names, order and split; first:
    # what datatrove keeps in most clusters (its union-find root), and the original rather
    # than a later copy where the input is in order, at the price of that independence.
    minhash_keep: str = option(
        "smallest_id",
        "which document of a near-duplicate cluster stays: smallest_id (its smallest content "
        "id: no file name or order changes it) or first (the first in input order: sorted "
        "paths, then position in the file)",
        choices=MINHASH_KEEP,
    )
    # Kiveris et al.'s alternating large-star and small-star rounds (curation_steps.py
    # components); curate's report.json says whether the last round changed anything, and
    # the console warns when it did.
    cc_rounds: int = option(
        8, "near-duplicate clusters: rounds of large-star/small-star connected components (a bound)"
    )
    filters: str = option(
        "",
        "comma-separated quality rule sets (gopher_quality, gopher_repetition, c4, "
        "fineweb); none by default",
    )
    languages: str = option("", "comma-separated languages to keep, e.g. en,zh; all by default")
    language_threshold: float = option(0.65, "language ID: the lowest score kept")
    decontaminate: tuple[str, ...] = option(
        (), "evaluation texts (files or globs): drop documents sharing an n-gram with them"
    )
    decontaminate_ngram: int = option(13, "decontamination: words per n-gram")

    def check_curation(self) -> None:
        """Raises ValueError naming the first curation flag with a value out of range."""
        checks = {
            "dedup": (self.dedup in DEDUP, f"one of {DEDUP}"),
            "minhash_ngram": (self.minhash_ngram >= 1, "must be at least 1"),
            "minhash_bands": (self.minhash_bands >= 1, "must be at least 1"),
            "minhash_rows": (self.minhash_rows >= 1, "must be at least 1"),
            "minhash_keep": (self.minhash_keep in MINHASH_KEEP, f"one of {MINHASH_KEEP}"),
            "cc_rounds": (1 <= self.cc_rounds <= 64, "must be in 1..64"),
            "language_threshold": (0.0 <= self.language_threshold <= 1.0, "must be in [0, 1]"),
            "decontaminate_ngram": (self.decontaminate_ngram >= 1, "must be at least 1"),
        }
        for name, (ok, allowed) in checks.items():
            if not ok:
                raise ValueError(f"--{name}: invalid value {getattr(self, name)!r}: {allowed}")
        if self.filters:
            from pipeline.core.filters import RULE_SETS

            unknown = [s for s in self.rule_sets if s not in RULE_SETS]
            if unknown:
                raise ValueError(
                    f"--filters: unknown rule set(s) {unknown}; known: {sorted(RULE_SETS)}"
                )

    @property
    def rule_sets(self) -> list[str]:
        return [s.strip() for s in self.filters.split(",") if s.strip()]

    @property
    def language_list(self) -> list[str]:
        return [s.strip() for s in self.languages.split(",") if s.strip()]

    @property
    def curating(self) -> bool:
        """Whether any curation step runs."""
        return bool(
            self.dedup != "none" or self.rule_sets or self.language_list or self.decontaminate
        )


CURATION_OPTIONS = tuple(f.name for f in dataclasses.fields(CurationOptions))


@dataclass(frozen=True)
class BuildConfig(CurationOptions):
    """Everything that decides the pipeline's output (all of it goes into the manifest)."""

    input: tuple[str, ...] = option(
        help="files or globs; local paths or anything Beam's FileSystems reach "
        "(gs://, s3://, hdfs://)",
        metavar="PATTERN",
    )
    output: str = option(help="output directory (local or a URI)")
    # nsp: Google's recipe; mlm: packed sentences for MLM-only training (core/packing.py).
    objective: str = option(
        "nsp",
        "nsp: Google's sentence pairs with a next-sentence label and static masks; mlm: "
        "contiguous sentences packed to --max_seq_length, no NSP, unmasked (the trainer "
        "masks them at its --mask-rate) unless --static_masks true",
        choices=OBJECTIVES,
    )
    # full_sentences by default: on the main job's corpus 0.971 (128) and 0.994 (512) of a
    # row's slots hold a token, against doc_sentences' 0.793 and 0.549 (bench/mlm_rows.py),
    # so a step of the same batch trains on more tokens; RoBERTa found the two within a few
    # tenths of a point of each other downstream.
    mlm_packing: str = option(
        "full_sentences",
        "--objective mlm: full_sentences: rows fill up across documents, a [SEP] between "
        "two; doc_sentences: a row never crosses a document boundary",
        choices=PACKINGS,
    )
    static_masks: bool = option(
        False,
        "--objective mlm: also mask the rows here, at --masked_lm_prob, --dupe_factor "
        "passes with fresh masks (NSP rows are always masked statically)",
    )
    max_seq_length: int = option(128, "tokens per row, [CLS] and every [SEP] included")
    # None: follows the rate, ceil(masked_lm_prob * max_seq_length), which no row reaches
    # (a row of n tokens gets round(n * p) predictions), so the rate is the rate: 20 at
    # Google's 128 and 0.15. A cap set lower lowers the rate (the build warns).
    max_predictions_per_seq: int | None = option(
        None,
        "cap on masked positions per row (default: ceil(masked_lm_prob * max_seq_length), "
        "which never lowers the rate: 20 at 128 tokens and 0.15)",
    )
    masked_lm_prob: float | None = option(
        None, "share of a row's tokens to predict (default 0.15; static masks only)"
    )
    short_seq_prob: float = option(
        0.1, "NSP rows: probability, per document and pass, of a random shorter target length"
    )
    dupe_factor: int | None = option(
        None,
        "passes over the data, each with fresh masks (default 10 with static masks, as "
        "Google; 1 for unmasked MLM rows, which hold each sentence once)",
    )
    random_seed: int = option(12345, "seed of all randomness")
    do_lower_case: bool = option(True, "lowercase and strip accents (uncased model)")
    do_whole_word_mask: bool = option(False, "mask all WordPieces of a word together")
    # Chinese words have no "##" pieces; a segmenter finds them (pipeline/core/segment.py).
    wwm_segmenter: str = option(
        "none",
        "whole-word masking: also mask the characters of a word a segmenter finds (jieba: "
        "Chinese words; needs --do_whole_word_mask true and pip install "
        "'bert-pipeline[cjk]'); none: \"##\" pieces only, as Google",
        choices=SEGMENTERS,
    )
    vocab_file: str | None = option(None, "reuse this vocab.txt instead of learning one")
    vocab_size: int = option(30522, "size of the learned vocab, special tokens included")
    # None: from the input size (see TARGET_SHARD_BYTES).
    num_shards: int | None = option(
        None, "number of output shards (default: from the input size, ~128 MB each)"
    )
    # auto: from the files' names (pipeline/core/sources.py).
    input_format: str = option(
        "auto",
        "txt: one sentence per line, blank line between documents; jsonl/parquet: "
        "one document per record, split into sentences; auto: from the extension (.txt, "
        ".jsonl/.json/.ndjson, .parquet; .gz etc. ignored), else from the first bytes. "
        "Each file's first bytes must agree with the format",
        choices=INPUT_FORMATS,
    )
    text_field: str = option("text", "field (jsonl) or column (parquet) holding the text")
    # Random-next segments come from the same bucket of documents; buckets hold
    # about this many documents (all of them when there are fewer).
    bucket_size: int = option(
        1000, "at least this many documents per random-next bucket (all of them when fewer)"
    )
    # Vocab learning: words seen fewer times are not counted into merges.
    min_frequency: int = option(2, "vocab learning: minimum count of a word or merge")
    overwrite: bool = option(False, "replace shards and manifest already in --output")
    # Threads of the tokenizers library per Beam worker process; 0: automatic
    # (see resolve_tokenizer_threads). Speed only: not part of the manifest.
    tokenizer_threads: int = option(
        0,
        "threads of the tokenizers library per Beam worker; 0: the machine's cores "
        "divided by --direct_num_workers on the DirectRunner, 1 on other runners "
        "(they run one worker process per core)",
    )

    # Speed only: where files are cut changes no byte of the output; not in the manifest.
    input_split_mb: float = option(
        0.0,
        "read input files in ranges of this many MB, each a task for any worker (a big file "
        "is read by all of them); 0: the input's size / 1024, between 1 and 64 MB. "
        "Compressed files are read whole",
    )

    # Memory only: the rows are the same either way; not in the manifest.
    spool: str = option(
        "auto",
        "yes: rows go from the instance step to the shard writers through files in --output "
        "(hidden, removed at the end) and only references to them through the runner; no: "
        "through the runner's shuffle; auto: yes on the DirectRunner, which holds its "
        "shuffle in memory, no on runners that shuffle through their own disks or service",
        choices=SPOOL,
    )

    # Checked before the job starts (pipeline/beam/sizing.py, with the coefficients of
    # pipeline/beam/memory.py); not in the manifest.
    force: bool = option(
        False,
        f"build on the local runner even when its memory estimate ({memory.estimate_rule()}) "
        f"exceeds {memory.USABLE_SHARE * 100:.0f} percent of the memory available",
    )

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("input: give at least one path or glob")
        self.check_curation()
        self._resolve_masking()
        for name, (ok, allowed) in self._checks().items():
            if not ok:
                raise ValueError(f"--{name}: invalid value {getattr(self, name)!r}: {allowed}")
        if self.wwm_segmenter != "none" and self.masked and not self.do_whole_word_mask:
            raise ValueError(
                f"--wwm_segmenter {self.wwm_segmenter} finds words for whole-word masking: "
                "add --do_whole_word_mask true"
            )

    @property
    def read_options(self) -> ReadOptions:
        return ReadOptions(self.input_format, self.text_field)

    @property
    def kind(self) -> str:
        """The row kind the build writes (``pipeline.shards.shard_format.KINDS``)."""
        if self.objective == "nsp":
            return "nsp"
        return "mlm_masked" if self.static_masks else "mlm"

    @property
    def masked(self) -> bool:
        """Whether the build masks its rows (NSP rows, or MLM rows with static masks)."""
        return self.kind != "mlm"

    @property
    def capped_rate(self) -> bool:
        """A --max_predictions_per_seq that lowers the rate of full-length rows."""
        if not self.masked:
            return False
        return int(self.uncapped_predictions()[-1]) > self.max_predictions_per_seq

    def uncapped_predictions(self):
        """int64 [max_seq_length + 1]: the predictions a row of each length would get at
        --masked_lm_prob without a cap (Google's rule, pipeline/core/masking.py)."""
        import numpy as np

        from pipeline.core.masking import MaskingConfig, num_to_predict

        uncapped = MaskingConfig(self.masked_lm_prob, 2**31 - 1, self.do_whole_word_mask)
        return num_to_predict(np.arange(self.max_seq_length + 1), uncapped)

    def _resolve_masking(self) -> None:
        """Fill the masking options left unset: static masks at 0.15, a cap that follows
        the rate, 10 passes; unmasked MLM rows take none of them (one pass).

        Raises:
            ValueError: a masking option given for unmasked MLM rows.
        """
        if not self.masked:
            given = {
                "masked_lm_prob": self.masked_lm_prob is not None,
                "max_predictions_per_seq": self.max_predictions_per_seq is not None,
                "dupe_factor": self.dupe_factor not in (None, 1),
                "do_whole_word_mask": self.do_whole_word_mask,
            }
            for name, set_ in given.items():
                if set_:
                    raise ValueError(
                        f"--{name} shapes static masks, and --objective mlm rows are unmasked "
                        "by default (the trainer masks them, at its --mask-rate, whole words "
                        "from the rows' continues_word column): add --static_masks true, or "
                        f"leave --{name} out"
                    )
            object.__setattr__(self, "dupe_factor", 1)
            return
        if self.masked_lm_prob is None:
            object.__setattr__(self, "masked_lm_prob", 0.15)
        if self.dupe_factor is None:
            object.__setattr__(self, "dupe_factor", 10)
        if self.max_predictions_per_seq is None and 0.0 < self.masked_lm_prob <= 1.0:
            cap = max(1, math.ceil(self.masked_lm_prob * self.max_seq_length - 1e-9))
            object.__setattr__(self, "max_predictions_per_seq", cap)

    def _checks(self) -> dict[str, tuple[bool, str]]:
        """Each bounded option: (whether its value is allowed, what is allowed)."""
        masked = self.masked
        return {
            # [CLS] A [SEP] B [SEP] with a token on each side.
            "max_seq_length": (self.max_seq_length >= 5, "must be at least 5"),
            "max_predictions_per_seq": (
                not masked or (self.max_predictions_per_seq or 1) >= 1,
                "must be at least 1",
            ),
            "masked_lm_prob": (
                not masked or 0.0 < self.masked_lm_prob <= 1.0,
                "must be in (0, 1]",
            ),
            "short_seq_prob": (0.0 <= self.short_seq_prob <= 1.0, "must be in [0, 1]"),
            "dupe_factor": (self.dupe_factor >= 1, "must be at least 1"),
            "objective": (self.objective in OBJECTIVES, f"one of {OBJECTIVES}"),
            "mlm_packing": (self.mlm_packing in PACKINGS, f"one of {PACKINGS}"),
            "random_seed": (self.random_seed >= 0, "must be 0 or more"),
            # The five special tokens and one more; a learned vocab also holds the corpus's
            # alphabet, checked once the words are counted (vocab_steps.learn_vocab).
            "vocab_size": (self.vocab_size >= 6, "must be at least 6 (BERT's is 30522)"),
            "num_shards": (
                self.num_shards is None or 1 <= self.num_shards <= 99999,
                "must be in 1..99999 (shard names have 5 digits)",
            ),
            "input_format": (self.input_format in INPUT_FORMATS, f"one of {INPUT_FORMATS}"),
            "bucket_size": (self.bucket_size >= 1, "must be at least 1"),
            "min_frequency": (self.min_frequency >= 1, "must be at least 1"),
            "tokenizer_threads": (self.tokenizer_threads >= 0, "must be 0 (automatic) or more"),
            "input_split_mb": (self.input_split_mb >= 0, "must be 0 (automatic) or more"),
            "spool": (self.spool in SPOOL, f"one of {SPOOL}"),
            "wwm_segmenter": (self.wwm_segmenter in SEGMENTERS, f"one of {SEGMENTERS}"),
        }

    def params(self) -> dict:
        """The manifest's ``params``: every option that shapes the data, and the seed.

        The output location is left out so the same build into two directories gives
        byte-identical manifests. ``wwm_segmenter`` is there only when one is used (the
        build adds its version), so builds without one keep the manifests they had; NSP
        builds likewise record no ``objective`` (absent: nsp) nor the MLM options. MLM
        builds leave out the NSP option (``short_seq_prob``) and, unmasked, the masking
        options (the trainer masks their rows).
        """
        values = dataclasses.asdict(self)
        for key in (
            "output",
            "overwrite",
            "tokenizer_threads",
            "input_split_mb",
            "spool",
            "force",
        ):
            values.pop(key)
        if self.wwm_segmenter == "none":
            values.pop("wwm_segmenter")
        if not self.curating:  # builds without curation keep the manifests they had
            for key in CURATION_OPTIONS:
                values.pop(key)
        else:
            values["decontaminate"] = list(self.decontaminate)
        if self.objective == "nsp":
            for key in ("objective", "mlm_packing", "static_masks"):
                values.pop(key)
        else:
            values.pop("short_seq_prob")
        if not self.masked:
            for key in ("masked_lm_prob", "max_predictions_per_seq", "do_whole_word_mask"):
                values.pop(key)
        values["input"] = list(self.input)
        return values


def job_parser(command: str, description: str, options=None, **kwargs) -> CommandParser:
    """The parser of the Beam command ``python -m pipeline COMMAND`` (build, curate, export):
    its description, the epilog on the console and log file that all three share, and a
    flag per field of the ``options`` dataclass (Google's names, with underscores)."""
    p = CommandParser(
        prog=f"python -m pipeline {command}",
        description=description + " Unrecognised options (--runner, --direct_num_workers=N, "
        "...) are passed to Apache Beam.",
        epilog="Console: our progress lines only; Beam's logs go to --log_file PATH (default: "
        f"OUTPUT.{command}.log beside the output directory). --verbose or BERT_VERBOSE=1 "
        "shows everything.",
        **kwargs,
    )
    if options is not None:
        add_options(p, options, sep="_")
    return p


def build_parser() -> argparse.ArgumentParser:
    """``--config FILE`` and one flag per BuildConfig field, Google's names (underscores)."""
    description = (
        "Raw text -> WordPiece vocab -> NSP pairs and static masks (or, with --objective mlm, "
        "packed sentences) -> Arrow shards."
    )
    return job_parser("build", description, BuildConfig)


def parse_build_args(argv: Sequence[str]) -> tuple[BuildConfig, list[str]]:
    """Split argv into our BuildConfig (defaults < ``--config FILE`` < flags) and the Beam
    pipeline arguments.

    Raises:
        ValueError: a bad ``--config`` file, a missing or invalid option (names it).
    """
    return parse_options(build_parser(), BuildConfig, argv, sep="_", known=True)


def is_local_runner(runner: str | None) -> bool:
    """The DirectRunner (Beam's default) or the FnApiRunner it runs on."""
    return runner is None or runner.rsplit(".", 1)[-1] in ("DirectRunner", "FnApiRunner")


def resolve_tokenizer_threads(
    requested: int, runner: str | None, direct_num_workers: int, cpus: int
) -> int:
    """The tokenizer threads per worker: ``requested``, or for 0 (automatic) the
    cores left to each worker on the local DirectRunner and 1 elsewhere.

    Beam runs one worker process per core on Dataflow, Flink and Spark, so a
    tokenizer that also spread each batch over every core would oversubscribe
    them (the ``datasets`` library turns tokenizer parallelism off in its worker
    processes for the same reason). ``direct_num_workers`` 0 means one per core.
    """
    if requested:
        return requested
    if not is_local_runner(runner):
        return 1
    workers = direct_num_workers if direct_num_workers > 0 else cpus
    return max(1, cpus // max(1, workers))
