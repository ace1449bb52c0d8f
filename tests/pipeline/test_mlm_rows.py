"""MLM-only rows (``--objective mlm``): packing, the row kinds' contract, the build end to
end, and masking rates that are rates."""

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.beam.config import BuildConfig
from pipeline.cli.main import main
from pipeline.core.packing import assemble_packed_rows, plan_packed_rows
from pipeline.core.sources import read_txt
from pipeline.core.vocab import build_tokenizer, read_vocab
from pipeline.shards import shard_format, shard_writer, validate
from tests.helpers import make_corpus

BASE = ["--vocab_size", "200", "--num_shards", "3", "--bucket_size", "10", "--random_seed", "7"]


# ----------------------------------------------------------------------------- packing


def random_documents(rng: random.Random, n_docs: int, longest: int) -> tuple[list, list]:
    counts = [rng.randint(0, 6) for _ in range(n_docs)]
    lengths = [rng.choice([0, *range(1, longest + 1)]) for _ in range(sum(counts))]
    return lengths, counts


def rows_of(lengths, counts, capacity, cross):
    """The packed rows as lists of (doc, sentence, first token, last token) per token."""
    tokens = np.arange(sum(lengths), dtype=np.int64) + 10
    pieces, row_docs = plan_packed_rows(lengths, counts, capacity, cross)
    ids, _source, offsets = assemble_packed_rows(tokens, pieces, len(row_docs), 1, 2)
    return pieces, row_docs, [ids[offsets[r] : offsets[r + 1]] for r in range(len(row_docs))]


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_packing_keeps_every_token_once_in_order_within_the_row_length(cross, seed):
    rng = random.Random(seed)
    capacity = rng.choice([3, 6, 14, 30])
    lengths, counts = random_documents(rng, rng.randint(1, 40), 2 * capacity)
    _pieces, row_docs, rows = rows_of(lengths, counts, capacity, cross)
    doc_of_token = np.repeat(np.repeat(np.arange(len(counts)), counts), lengths)
    # Every token once, each document's in its order; [CLS] first, [SEP] last and between.
    text = np.concatenate([row[1:-1][row[1:-1] != 2] for row in rows] or [np.zeros(0)])
    assert sorted(text.tolist()) == list(range(10, 10 + sum(lengths)))
    for doc in range(len(counts)):
        mine = text[doc_of_token[text - 10] == doc]
        assert (np.diff(mine) == 1).all()
    for row in rows:
        assert row[0] == 1 and row[-1] == 2 and 3 <= len(row) <= capacity + 2
        assert 1 not in row[1:]
        parts = np.split(row[1:-1], np.flatnonzero(row[1:-1] == 2))
        docs = [set(doc_of_token[part[part != 2] - 10]) for part in parts]
        assert all(len(d) == 1 for d in docs)  # a piece is one document's
        assert len({min(d) for d in docs}) == len(docs)  # a document once per row
        assert cross or len(parts) == 1
    assert len(row_docs) == len(rows)
    assert cross or (np.diff(row_docs) >= 0).all()


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_rows_are_cut_at_sentence_boundaries_unless_a_sentence_is_longer_than_a_row(cross, seed):
    """A piece of a document starts and ends at sentence boundaries, but in a sentence
    longer than a row; doc_sentences closes a row only before a sentence that does not fit
    (full_sentences then fills the room from other documents: test below)."""
    rng = random.Random(seed)
    capacity = rng.choice([6, 14, 30])
    lengths, counts = random_documents(rng, rng.randint(1, 40), 2 * capacity)
    starts = np.cumsum([0, *lengths])
    boundaries = set(starts.tolist())
    sentence_of = np.repeat(np.arange(len(lengths)), lengths)
    doc_of_token = np.repeat(np.repeat(np.arange(len(counts)), counts), lengths)
    pieces, _row_docs, rows = rows_of(lengths, counts, capacity, cross)
    for _, start, stop in pieces:
        for cut, inside in ((start, start), (stop, stop - 1)):
            if cut not in boundaries:
                assert lengths[sentence_of[inside]] > capacity
    if cross:
        return
    for r in range(len(rows) - 1):
        (_, _, stop), (_, start, _) = pieces[r], pieces[r + 1]
        used = len(rows[r]) - 2
        same_doc = doc_of_token[stop - 1] == doc_of_token[start]
        if start == stop and start in boundaries and same_doc:  # the document goes on
            assert used + lengths[sentence_of[start]] > capacity


def test_full_sentences_fill_a_rows_room_from_other_documents():
    """Three documents of 5 + 4, 3 and 2 tokens in rows of 8: the second document's
    sentence fills the room the first one's second sentence does not fit in."""
    _, row_docs, rows = rows_of([5, 4, 2, 3], [2, 1, 1], capacity=8, cross=True)
    assert [r.tolist() for r in rows] == [
        [1, 10, 11, 12, 13, 14, 2, 19, 20, 2],  # doc 0's first sentence, [SEP], doc 1's
        [1, 15, 16, 17, 18, 2, 21, 22, 23, 2],  # doc 0's second sentence, [SEP], doc 2's
    ]
    assert row_docs.tolist() == [0, 0]
    _, _, rows = rows_of([5, 4, 2, 3], [2, 1, 1], capacity=8, cross=False)
    assert len(rows) == 4


def test_a_sentence_longer_than_a_row_fills_the_room_left_and_is_never_dropped():
    _, _, rows = rows_of([4, 20, 2], [1, 2], capacity=6, cross=True)
    assert [r.tolist() for r in rows] == [
        [1, 10, 11, 12, 13, 2, 14, 2],  # doc 0, a [SEP], doc 1's long sentence starts
        [1, *range(15, 21), 2],
        [1, *range(21, 27), 2],
        [1, *range(27, 33), 2],
        [1, 33, 34, 35, 2],  # the long sentence's last token, then the next sentence
    ]
    _, _, rows = rows_of([3, 20], [1, 1], capacity=6, cross=True)
    assert sum(len(r) - 2 for r in rows) == 3 + 20 + 1  # every token, one separator
    _, _, rows = rows_of([4, 20, 2], [1, 2], capacity=6, cross=False)
    assert rows[0].tolist() == [1, 10, 11, 12, 13, 2] and rows[1].tolist() == [1, *range(14, 20), 2]


# ----------------------------------------------------------------------------- the contract


def mlm_columns(rows: list[list[int]], words: list[list[bool]]):
    return {"input_ids": rows, "continues_word": [np.array(w, dtype=bool) for w in words]}


def test_mlm_shards_round_trip_and_readers_refuse_an_unknown_kind(tmp_path):
    schema = shard_format.shard_schema(50, 16, "mlm")
    assert schema.metadata[b"bert_shard_kind"] == b"mlm"
    assert shard_format.shard_schema(50, 16).metadata.get(b"bert_shard_kind") is None
    rows = [[2, 7, 8, 3, 9, 3], [2, 11, 3]]
    data = shard_writer.encode_shard(mlm_columns(rows, [[0, 0, 1, 0, 0, 0], [0, 0, 0]]), schema)
    (tmp_path / "s.arrow").write_bytes(data)
    table = shard_format.open_shard(tmp_path / "s.arrow")
    got = list(shard_format.iter_rows(table))
    assert [r["input_ids"].tolist() for r in got] == rows
    assert got[0]["continues_word"].tolist() == [False, False, True, False, False, False]
    assert set(got[0]) == {"input_ids", "continues_word"}
    # A kind this reader does not know: refused, naming the kinds it knows.
    alien = schema.with_metadata({**schema.metadata, b"bert_shard_kind": b"span_corruption"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, alien) as writer:
        writer.write_table(table.cast(alien))
    (tmp_path / "alien.arrow").write_bytes(sink.getvalue().to_pybytes())
    with pytest.raises(shard_format.ShardFormatError, match="'span_corruption' is unknown"):
        shard_format.open_shard(tmp_path / "alien.arrow")
    with pytest.raises(ValueError, match="mlm rows have exactly the columns"):
        shard_writer.encode_shard({"input_ids": rows}, schema)


SPECIAL = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


@pytest.mark.parametrize(
    ("rows", "words", "message"),
    [
        ([[2, 7, 8]], [[0, 0, 0]], "does not end with \\[SEP\\]"),
        ([[7, 8, 3]], [[0, 0, 0]], "does not start with \\[CLS\\]"),
        ([[2, 7, 3]], [[1, 0, 0]], "continues_word true at position 0"),
        ([[2, 7, 3, 8, 3]], [[0, 0, 0, 0, 1]], "continues_word true at position 4"),
        ([[2, 7, 4, 3]], [[0, 0, 0, 0]], "has \\[MASK\\] at position 2"),
        ([[2, 7, 3]], [[0, 0]], "continues_word: row 0 has a different length"),
    ],
)
def test_validate_names_the_row_that_breaks_the_mlm_layout(rows, words, message):
    flat = {
        "input_ids": (np.concatenate(rows), np.cumsum([0, *map(len, rows)])),
        "continues_word": (
            np.concatenate(words).astype(bool),
            np.cumsum([0, *map(len, words)]),
        ),
    }
    with pytest.raises(ValueError, match=message):
        validate.check_rows(
            flat, None, vocab_size=50, max_seq_length=16, special_ids=SPECIAL, kind="mlm"
        )


# ----------------------------------------------------------------------------- the build


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), n_docs=80)


def build(corpus, out: Path, *options: str) -> dict:
    assert main(["build", "--input", corpus, "--output", str(out), *BASE, *options]) == 0
    return validate.validate(str(out))


def documents(corpus: str, out: Path) -> list[list[int]]:
    """The corpus's documents as token ids, tokenized as the pipeline does."""
    vocab = read_vocab(out / "vocab.txt")
    tokenizer = build_tokenizer(vocab, True, specials_in_text=False)
    docs = []
    for path in sorted(Path(corpus).parent.glob("*.txt")):
        with open(path, "rb") as f:
            for sentences, _ in read_txt(f):
                encoded = tokenizer.encode_batch(sentences, add_special_tokens=False)
                docs.append([i for e in encoded for i in e.ids])
    return docs


def all_rows(out: Path) -> list[dict]:
    manifest = shard_format.read_manifest(out)
    return [
        row
        for entry in manifest["shards"]
        for row in shard_format.iter_rows(shard_format.open_shard(out / entry["name"]))
    ]


@pytest.mark.parametrize("packing", ["full_sentences", "doc_sentences"])
def test_an_mlm_build_holds_every_sentence_once_unmasked(corpus, tmp_path, packing):
    out = tmp_path / packing
    manifest = build(corpus, out, "--objective", "mlm", "--mlm_packing", packing)
    assert manifest["schema"]["kind"] == "mlm"
    params = manifest["params"]
    assert (params["objective"], params["mlm_packing"], params["static_masks"]) == (
        "mlm",
        packing,
        False,
    )
    assert params["dupe_factor"] == 1 and "masked_lm_prob" not in params
    vocab = read_vocab(out / "vocab.txt")
    docs = documents(corpus, out)
    text = {" ".join(map(str, d)) for d in docs}
    pieces = []
    for row in all_rows(out):
        ids = row["input_ids"]
        assert ids[0] == vocab.index("[CLS]") and ids[-1] == vocab.index("[SEP]")
        inner = np.split(ids[1:-1], np.flatnonzero(ids[1:-1] == vocab.index("[SEP]")))
        inner = [p[p != vocab.index("[SEP]")] for p in inner]
        assert packing == "full_sentences" or len(inner) == 1
        for part in inner:  # each piece is a contiguous run of one document's tokens
            assert any(" ".join(map(str, part)) in t for t in text)
            pieces.append(part)
        expected = [t.startswith("##") for t in (vocab[i] for i in ids)]
        expected[0] = False
        got = row["continues_word"].tolist()
        cut = [i for i in range(len(ids)) if expected[i] != got[i]]
        assert all(not got[i] and expected[i] for i in cut)  # only at a cut word's restart
    assert sum(map(len, pieces)) == sum(map(len, docs))  # every token once, none lost
    stats = manifest["stats"]
    assert stats["tokens"] == sum(map(len, pieces)) + stats["special_tokens"]
    assert 0 < stats["packing_efficiency"] <= 1


def test_full_sentences_fill_rows_better_than_doc_sentences(corpus, tmp_path):
    full = build(corpus, tmp_path / "full", "--objective", "mlm", "--max_seq_length", "64")
    doc = build(
        corpus,
        tmp_path / "doc",
        "--objective",
        "mlm",
        "--mlm_packing",
        "doc_sentences",
        "--max_seq_length",
        "64",
    )
    assert full["stats"]["packing_efficiency"] > 0.8  # 0.84 here; 0.72 in doc_sentences
    assert full["stats"]["packing_efficiency"] > doc["stats"]["packing_efficiency"]
    assert full["num_rows"] < doc["num_rows"]


def test_static_masks_on_mlm_rows_mask_at_the_rate_with_fresh_masks_per_pass(corpus, tmp_path):
    out = tmp_path / "static"
    options = ["--objective", "mlm", "--static_masks", "true", "--masked_lm_prob", "0.3"]
    manifest = build(corpus, out, *options, "--dupe_factor", "2")
    assert manifest["schema"]["kind"] == "mlm_masked"
    assert manifest["params"]["max_predictions_per_seq"] == 39  # ceil(0.3 * 128)
    assert abs(manifest["stats"]["masked_share_of_real_tokens"] - 0.3) < 0.02
    rows = all_rows(out)
    once = build(corpus, tmp_path / "once", *options, "--dupe_factor", "1")
    assert len(rows) == 2 * once["num_rows"]
    originals = {}
    for row in rows:  # the two passes: the same rows, masked differently
        ids = row["input_ids"].copy()
        ids[row["masked_lm_positions"]] = row["masked_lm_ids"]
        originals.setdefault(tuple(ids), []).append(tuple(row["masked_lm_positions"]))
    assert all(len(v) == 2 for v in originals.values())
    assert sum(a != b for a, b in originals.values()) > 0.9 * len(originals)


def test_mlm_builds_are_reproducible_and_other_seeds_differ(corpus, tmp_path):
    options = ["--objective", "mlm"]
    a, b = build(corpus, tmp_path / "a", *options), build(corpus, tmp_path / "b", *options)
    assert a == b
    for entry in a["shards"]:
        assert (tmp_path / "a" / entry["name"]).read_bytes() == (
            tmp_path / "b" / entry["name"]
        ).read_bytes()
    other = main(
        ["build", "--input", corpus, "--output", str(tmp_path / "c"), *BASE[:-1], "8", *options]
    )
    assert other == 0
    assert shard_format.read_manifest(tmp_path / "c")["shards"] != a["shards"]


@pytest.mark.parametrize(
    "option",
    [
        ["--masked_lm_prob", "0.3"],
        ["--max_predictions_per_seq", "9"],
        ["--dupe_factor", "5"],
        ["--do_whole_word_mask", "true"],
    ],
)
def test_a_masking_option_for_unmasked_mlm_rows_exits_2_naming_it(corpus, tmp_path, capfd, option):
    argv = ["build", "--input", corpus, "--output", str(tmp_path / "x"), "--objective", "mlm"]
    assert main([*argv, *option]) == 2
    err = capfd.readouterr().err
    assert f"{option[0]} shapes static masks" in err and "--static_masks true" in err
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- rates


def test_the_prediction_cap_follows_the_rate_and_a_lower_cap_warns(corpus, tmp_path, capfd):
    """--masked_lm_prob 0.3 masks 30% (it masked 17.1% under the old fixed cap of 20), at
    seq 128 and at seq 600; a cap set below the rate warns, and the manifest counts the
    rows it lowered."""
    for length in ("128", "600"):
        manifest = build(
            corpus,
            tmp_path / length,
            "--masked_lm_prob",
            "0.3",
            "--max_seq_length",
            length,
            "--dupe_factor",
            "1",
        )
        assert abs(manifest["stats"]["masked_share_of_real_tokens"] - 0.3) < 0.02, length
        assert "rows_capped" not in manifest["stats"]
    capfd.readouterr()
    capped = build(
        corpus,
        tmp_path / "capped",
        "--masked_lm_prob",
        "0.3",
        "--max_predictions_per_seq",
        "20",
        "--dupe_factor",
        "1",
    )
    err = capfd.readouterr().err
    assert re.search(r"--max_predictions_per_seq 20 lowers the masking rate", err), err
    assert capped["stats"]["rows_capped"] > 0
    assert capped["stats"]["masked_share_of_real_tokens"] < 0.25
    assert (
        json.loads((tmp_path / "600" / "manifest.json").read_text())["params"][
            "max_predictions_per_seq"
        ]
        == 180
    )  # ceil(0.3 * 600)
    # Google's defaults keep Google's cap: 20 at 128 tokens and 0.15, 77 at 512.
    config = BuildConfig(input=("x",), output="y")
    assert (config.masked_lm_prob, config.max_predictions_per_seq, config.dupe_factor) == (
        0.15,
        20,
        10,
    )
    assert BuildConfig(input=("x",), output="y", max_seq_length=512).max_predictions_per_seq == 77


# ----------------------------------------------------------------------------- runners


def run_build(corpus, out: Path, *args: str) -> None:
    """The build as a user runs it, in its own process (Beam's log beside ``out``)."""
    cmd = [sys.executable, "-m", "pipeline", "build", "--input", corpus, "--output", str(out)]
    done = subprocess.run(
        [*cmd, "--log_file", f"{out}.log", *BASE, *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix == ".arrow"}


MLM_RUNNERS = {
    "two worker processes": ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    "Dask": ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"],
}


@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(MLM_RUNNERS))
def test_mlm_rows_are_the_same_bytes_on_every_runner(corpus, tmp_path, runner):
    if runner == "Dask":
        pytest.importorskip("distributed", reason="Beam's DaskRunner needs the [dask] extra")
    options = ["--objective", "mlm", "--static_masks", "true", "--dupe_factor", "2"]
    reference = build(corpus, tmp_path / "in-process", *options)
    run_build(corpus, tmp_path / "other", *options, *MLM_RUNNERS[runner])
    assert shard_format.read_manifest(tmp_path / "other") == reference
    assert shard_bytes(tmp_path / "other") == shard_bytes(tmp_path / "in-process")


def test_stats_and_inspect_read_mlm_rows(corpus, tmp_path, capsys):
    out = tmp_path / "mlm"
    manifest = build(corpus, out, "--objective", "mlm", "--static_masks", "true")
    capsys.readouterr()
    assert main(["stats", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "random_next_share" not in printed
    share = manifest["stats"]["packing_efficiency"]
    assert re.search(rf"packing_efficiency: {share:.4f}".rstrip("0"), printed), printed
    assert main(["inspect", str(out), "-n", "3", "--words"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("no next-sentence label") == 3 and "[CLS]" in printed
    assert re.search(r"\[\S+>\S+\]", printed)  # a masked position as [input>target]


def test_stats_and_the_build_line_of_unmasked_rows_say_what_they_hold(corpus, tmp_path):
    # Unmasked rows have no predictions: no share of them is "random" (it said 1.0), and the
    # build's shares of short rows and filled slots are stated so that they agree.
    from pipeline.beam.build_job import row_shape
    from pipeline.cli.stats import compute_stats

    out = tmp_path / "mlm"
    build(corpus, out, "--objective", "mlm", "--max_seq_length", "64")
    stats = compute_stats(str(out))
    assert stats["masks_per_row"] == 0
    assert stats["mask_token_share"] is stats["random_id_share"] is stats["kept_share"] is None
    line = row_shape(stats, "mlm", 64)
    pattern = r"([\d.]+)% of token slots filled \(([\d.]+)% of rows end short of 64, by ([\d.]+)"
    filled, short, by = map(float, re.search(pattern, line).groups())
    assert line.endswith("no static masks: the trainer masks them"), line
    # The slots left empty are the short rows times their mean shortfall.
    assert (100 - filled) / 100 * 64 == pytest.approx(short / 100 * by, abs=0.06), line
