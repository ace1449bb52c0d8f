"""Beam steps that learn the build's vocab: DocumentBatches -> word counts -> WordPiece.

The counts are BERT basic-tokenized words (``pipeline/core/text.py``), summed in slices
so that no worker holds more than its share of the distinct words; the learner
(``pipeline/core/wordpiece.py``) runs once, on the whole count table. Part of
``python -m pipeline build`` (``LearnVocabulary`` in ``pipeline/beam/build.py``).
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from pipeline.beam.config import BuildConfig
from pipeline.beam.document_steps import DocumentBatch
from pipeline.beam.runner import UsageError
from pipeline.core.text import basic_tokenize
from pipeline.core.vocab import SPECIAL_TOKENS, learn_wordpiece_vocab
from pipeline.core.wordpiece import VocabSizeError

logger = logging.getLogger(__name__)


class CountWords(beam.PTransform):
    """DocumentBatches -> one ``{word: count}`` of BERT basic-tokenized words; memory:
    the distinct words, never the documents.

    Each bundle's words are counted in its worker (:class:`CountInBundle`) and sent on
    in ``WORD_SLICES`` slices by a stable hash of the word; each slice is summed on one
    worker, then the slices are joined into one table. (A CombineFn leaves the first
    step to the runner's combiner lifting, which Beam's DaskRunner lacks: there it
    gathered every document of the corpus on one worker.)
    """

    def __init__(self, do_lower_case: bool):
        super().__init__()
        self._lower = do_lower_case

    def expand(self, documents: beam.PCollection) -> beam.PCollection:
        return (
            documents
            | "CountInBundle" >> beam.ParDo(CountInBundle(self._lower))
            | "GroupSlices" >> beam.GroupByKey()
            | "SumSlices" >> beam.Map(sum_slice)
            | "JoinSlices" >> beam.CombineGlobally(JoinCounts())
        )


WORD_SLICES = 64


def word_slice(word: str) -> int:
    """A word's slice of the count table: a stable hash (never Python's salted ``hash``)."""
    return zlib.crc32(word.encode("utf-8")) % WORD_SLICES


class CountInBundle(beam.DoFn):
    """DocumentBatches -> (slice, {word: count}) per slice, for the whole bundle, at its end."""

    def __init__(self, do_lower_case: bool):
        self._lower = do_lower_case

    def start_bundle(self) -> None:
        self._counts: Counter = Counter()

    # No return annotation: Beam reads process's as the step's output type (an iterable of
    # elements), and this one emits from finish_bundle. `-> None` is refused since Beam 2.78
    # (tests/pipeline/test_type_hints.py).
    def process(self, batch: DocumentBatch):
        for sentences in batch.documents:
            for sentence in sentences:
                self._counts.update(basic_tokenize(sentence, self._lower))

    def finish_bundle(self) -> Iterator:
        slices: dict[int, dict[str, int]] = {}
        for word, count in self._counts.items():
            slices.setdefault(word_slice(word), {})[word] = count
        self._counts = Counter()
        for index, counts in slices.items():
            yield GlobalWindows.windowed_value((index, counts))


def sum_slice(element: tuple[int, Iterable[dict[str, int]]]) -> dict[str, int]:
    """(slice, each bundle's counts of its words) -> the slice's total counts."""
    total: Counter = Counter()
    for counts in element[1]:
        total.update(counts)
    return dict(total)


class JoinCounts(beam.CombineFn):
    """Slices of the count table (disjoint sets of words) -> the whole table."""

    def create_accumulator(self) -> dict[str, int]:
        return {}

    def add_input(self, table: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
        table.update(counts)
        return table

    def merge_accumulators(self, tables: Iterable[dict[str, int]]) -> dict[str, int]:
        it = iter(tables)
        table = next(it)
        for other in it:
            table.update(other)
        return table

    def extract_output(self, table: dict[str, int]) -> dict[str, int]:
        return table


def learn_vocab(word_counts: dict[str, int], config: BuildConfig) -> list[str]:
    """The word counts -> the build's vocab (WordPiece, ``config.vocab_size`` tokens).

    Raises:
        UsageError: ``--vocab_size`` cannot hold the corpus's alphabet (exit 2, naming
            the size that can).
    """
    if not word_counts:
        # No documents: the build makes 0 rows, and the driver says so and removes it.
        return list(SPECIAL_TOKENS)
    logger.info(
        "learning a %d-token vocab from %d distinct words", config.vocab_size, len(word_counts)
    )
    try:
        return learn_wordpiece_vocab(
            word_counts, config.vocab_size, min_frequency=config.min_frequency
        )
    except VocabSizeError as err:
        raise UsageError(
            f"--vocab_size {config.vocab_size} is too small for this corpus: its "
            f"{len(SPECIAL_TOKENS)} special tokens and its alphabet (each character, and "
            f"##c for those inside words) need {err.needed}; pass --vocab_size {err.needed} "
            "or more (BERT's is 30522), or --vocab_file with a vocab.txt to reuse"
        ) from None
