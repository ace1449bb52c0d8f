"""Options of ``python -m pipeline build``: one validated config, Google's flag names.

Our flags are parsed with ``parse_known_args``; everything else on the command line
(``--runner``, ``--direct_num_workers``, ``--temp_location``, ``--setup_file``, ...)
goes to Beam untouched.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

INPUT_FORMATS = ("auto", "txt", "jsonl", "parquet")
# Shards aim at this many bytes when --num_shards is not given (64-256 MB window).
TARGET_SHARD_BYTES = 128 * 2**20
# Output bytes per input byte and dupe pass, measured on English text at seq 128
# (uint16 ids + uint8 segments + masks + Arrow offsets); only sizes the shard count.
OUTPUT_BYTES_PER_INPUT_BYTE = 0.9


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "y", "on"):
        return True
    if value in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


@dataclass(frozen=True)
class BuildConfig:
    """Everything that decides the pipeline's output (all of it goes into the manifest)."""

    input: tuple[str, ...]
    output: str
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    do_lower_case: bool = True
    do_whole_word_mask: bool = False
    vocab_file: str | None = None
    vocab_size: int = 30522
    num_shards: int | None = None  # None: from the input size (see TARGET_SHARD_BYTES)
    input_format: str = "auto"  # auto: from the files' names (pipeline/sources.py)
    text_field: str = "text"
    # Random-next segments come from the same bucket of documents; buckets hold
    # about this many documents (all of them when there are fewer).
    bucket_size: int = 1000
    # Vocab learning: words seen fewer times are not counted into merges.
    min_frequency: int = 2
    overwrite: bool = False
    # Threads of the tokenizers library per Beam worker process; 0: automatic
    # (see resolve_tokenizer_threads). Speed only: not part of the manifest.
    tokenizer_threads: int = 0

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("input: give at least one path or glob")
        checks = {
            "max_seq_length": self.max_seq_length >= 5,
            "max_predictions_per_seq": self.max_predictions_per_seq >= 1,
            "masked_lm_prob": 0.0 < self.masked_lm_prob <= 1.0,
            "short_seq_prob": 0.0 <= self.short_seq_prob <= 1.0,
            "dupe_factor": self.dupe_factor >= 1,
            "random_seed": self.random_seed >= 0,
            "vocab_size": self.vocab_size >= 6,
            "num_shards": self.num_shards is None or 1 <= self.num_shards <= 99999,
            "input_format": self.input_format in INPUT_FORMATS,
            "bucket_size": self.bucket_size >= 1,
            "min_frequency": self.min_frequency >= 1,
            "tokenizer_threads": self.tokenizer_threads >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"--{name}: invalid value {getattr(self, name)!r}")

    def params(self) -> dict:
        """The manifest's ``params``: every option that shapes the data, and the seed.

        The output location is left out so the same build into two directories gives
        byte-identical manifests.
        """
        values = dataclasses.asdict(self)
        for key in ("output", "overwrite", "tokenizer_threads"):
            values.pop(key)
        values["input"] = list(self.input)
        return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline build",
        description="Raw text -> WordPiece vocab -> NSP pairs -> static masks -> Arrow shards. "
        "Unrecognised options (--runner, --direct_num_workers, ...) are passed to Apache Beam.",
        epilog="Console: our progress lines only; Beam's logs go to --log_file PATH (default: "
        "OUTPUT.build.log beside the output directory). --verbose or BERT_VERBOSE=1 shows "
        "everything.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d = BuildConfig(input=("x",), output="x")
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="PATTERN",
        help="files or globs; local paths or anything Beam's FileSystems reach "
        "(gs://, s3://, hdfs://)",
    )
    p.add_argument("--output", required=True, help="output directory (local or a URI)")
    p.add_argument(
        "--max_seq_length",
        type=int,
        default=d.max_seq_length,
        help="tokens per row, [CLS] and both [SEP] included",
    )
    p.add_argument(
        "--max_predictions_per_seq",
        type=int,
        default=d.max_predictions_per_seq,
        help="cap on masked positions per row",
    )
    p.add_argument(
        "--masked_lm_prob",
        type=float,
        default=d.masked_lm_prob,
        help="share of a row's tokens to predict",
    )
    p.add_argument(
        "--short_seq_prob",
        type=float,
        default=d.short_seq_prob,
        help="probability, per document and pass, of a random shorter target length",
    )
    p.add_argument(
        "--dupe_factor",
        type=int,
        default=d.dupe_factor,
        help="passes over the data, each with fresh randomness",
    )
    p.add_argument("--random_seed", type=int, default=d.random_seed, help="seed of all randomness")
    p.add_argument(
        "--do_lower_case",
        type=_bool,
        default=d.do_lower_case,
        help="lowercase and strip accents (uncased model)",
    )
    p.add_argument(
        "--do_whole_word_mask",
        type=_bool,
        default=d.do_whole_word_mask,
        help="mask all WordPieces of a word together",
    )
    p.add_argument(
        "--vocab_file", default=None, help="reuse this vocab.txt instead of learning one"
    )
    p.add_argument(
        "--vocab_size",
        type=int,
        default=d.vocab_size,
        help="size of the learned vocab, special tokens included",
    )
    p.add_argument(
        "--num_shards",
        type=int,
        default=None,
        help="number of output shards (default: from the input size, ~128 MB each)",
    )
    p.add_argument(
        "--input_format",
        choices=INPUT_FORMATS,
        default=d.input_format,
        help="txt: one sentence per line, blank line between documents; jsonl/parquet: "
        "one document per record, split into sentences; auto: from the extension (.txt, "
        ".jsonl/.json/.ndjson, .parquet; .gz etc. ignored), else from the first bytes. "
        "Each file's first bytes must agree with the format",
    )
    p.add_argument(
        "--text_field",
        default=d.text_field,
        help="field (jsonl) or column (parquet) holding the text",
    )
    p.add_argument(
        "--bucket_size",
        type=int,
        default=d.bucket_size,
        help="at least this many documents per random-next bucket (all of them when fewer)",
    )
    p.add_argument(
        "--min_frequency",
        type=int,
        default=d.min_frequency,
        help="vocab learning: minimum count of a word or merge",
    )
    p.add_argument(
        "--tokenizer_threads",
        type=int,
        default=d.tokenizer_threads,
        help="threads of the tokenizers library per Beam worker; 0: the machine's cores "
        "divided by --direct_num_workers on the DirectRunner, 1 on other runners "
        "(they run one worker process per core)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace shards and manifest already in --output"
    )
    return p


def parse_build_args(argv: Sequence[str]) -> tuple[BuildConfig, list[str]]:
    """Split argv into our BuildConfig and the Beam pipeline arguments.

    Raises:
        ValueError: an option has an invalid value (names the option).
    """
    args, beam_args = build_parser().parse_known_args(list(argv))
    values = vars(args)
    values["input"] = tuple(values["input"])
    return BuildConfig(**values), beam_args


def resolve_tokenizer_threads(requested: int, runner: str | None, direct_num_workers: int,
                              cpus: int) -> int:  # fmt: skip
    """The tokenizer threads per worker: ``requested``, or for 0 (automatic) the
    cores left to each worker on the local DirectRunner and 1 elsewhere.

    Beam runs one worker process per core on Dataflow, Flink and Spark, so a
    tokenizer that also spread each batch over every core would oversubscribe
    them (the ``datasets`` library turns tokenizer parallelism off in its worker
    processes for the same reason). ``direct_num_workers`` 0 means one per core.
    """
    if requested:
        return requested
    local = runner is None or runner.rsplit(".", 1)[-1] in ("DirectRunner", "FnApiRunner")
    if not local:
        return 1
    workers = direct_num_workers if direct_num_workers > 0 else cpus
    return max(1, cpus // max(1, workers))
