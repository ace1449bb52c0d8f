"""The whole Beam job on a tiny corpus: outputs, statistics, errors, determinism across runners."""

import gzip
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.beam.config import BuildConfig
from pipeline.beam.document_steps import TokenizedBatch
from pipeline.beam.runner import check_beam_options
from pipeline.cli.main import main
from pipeline.cli.stats import compute_stats
from pipeline.core.sources import read_txt
from pipeline.core.vocab import SPECIAL_TOKENS, read_vocab
from pipeline.shards import shard_format
from tests.helpers import WORDS, make_corpus

BASE = [
    "--vocab_size",
    "200",
    "--dupe_factor",
    "3",
    "--max_seq_length",
    "48",
    "--max_predictions_per_seq",
    "8",
    "--num_shards",
    "3",
    "--bucket_size",
    "10",
    "--random_seed",
    "7",
]

DASK_EXTRA = "Beam's DaskRunner needs the [dask] extra (distributed)"


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if not p.name.endswith(".png")
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def built(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    assert main(["build", "--input", corpus, "--output", str(out), *BASE]) == 0
    return out


def test_outputs_are_complete_and_verified(built):
    manifest = shard_format.verify_directory(str(built))
    names = sorted(p.name for p in built.iterdir())
    assert names == [
        "manifest.json",
        "shard-00000-of-00003.arrow",
        "shard-00001-of-00003.arrow",
        "shard-00002-of-00003.arrow",
        "tokenizer.json",
        "vocab.txt",
    ]
    assert manifest["params"]["random_seed"] == 7
    assert manifest["params"]["dupe_factor"] == 3
    assert manifest["vocab"]["size"] == len(read_vocab(built / "vocab.txt")) == 200
    assert manifest["vocab"]["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    rows = [
        r
        for e in manifest["shards"]
        for r in shard_format.iter_rows(shard_format.open_shard(str(built / e["name"])))
    ]
    assert len(rows) == manifest["num_rows"] > 100
    for r in rows:
        ids, seg = r["input_ids"], r["segment_ids"]
        assert 5 <= len(ids) <= 48 and ids[0] == 2 and ids[-1] == 3
        first_sep = int((seg == 0).sum()) - 1  # [CLS] A [SEP] are segment 0, B [SEP] segment 1
        assert (seg[: first_sep + 1] == 0).all() and (seg[first_sep + 1 :] == 1).all()
        assert ids[first_sep] == 3 and first_sep < len(ids) - 2
        assert len(r["masked_lm_positions"]) <= 8
        assert not set(r["masked_lm_positions"].tolist()) & {0, first_sep, len(ids) - 1}


def test_statistics_match_googles_shape(built):
    stats = compute_stats(str(built))
    manifest = shard_format.read_manifest(str(built))
    assert stats["rows"] == manifest["num_rows"] == manifest["stats"]["rows"]
    assert 0.45 < stats["random_next_share"] < 0.7
    assert stats["masks_per_full_row"] == 7  # round(48 * 0.15) = 7 <= cap 8
    assert stats["rows_at_max_predictions_share"] == 0.0  # 7 < cap 8 on every row
    assert stats["real_tokens"] == stats["tokens"] - 3 * stats["rows"]
    percentiles = list(stats["length_percentiles"].values())
    assert percentiles == sorted(percentiles) and percentiles[0] >= 5 and percentiles[-1] <= 48
    assert 0.7 < stats["mask_token_share"] < 0.9
    assert stats["short_row_share"] > 0.1
    assert manifest["stats"]["documents"] == 120


def test_same_seed_same_bytes_other_seed_differs(corpus, built, tmp_path):
    again = tmp_path / "again"
    # Tokenizer threads change speed only: same shards, same manifest.
    threads = ["--tokenizer_threads", "1"]
    assert main(["build", "--input", corpus, "--output", str(again), *BASE, *threads]) == 0
    assert digest(again) == digest(built)
    other = tmp_path / "other"
    seed = ["--random_seed", "8"]
    assert main(["build", "--input", corpus, "--output", str(other), *BASE, *seed]) == 0
    assert digest(other)["vocab.txt"] == digest(built)["vocab.txt"]
    assert (
        digest(other)["shard-00000-of-00003.arrow"] != digest(built)["shard-00000-of-00003.arrow"]
    )


def test_vocab_file_is_reused(corpus, built, tmp_path):
    out = tmp_path / "reuse"
    args = ["--vocab_file", str(built / "vocab.txt")]
    assert main(["build", "--input", corpus, "--output", str(out), *BASE, *args]) == 0
    same, reused = digest(built), digest(out)
    assert reused.pop("manifest.json") != same.pop("manifest.json")  # params.vocab_file differs
    assert reused == same  # same vocab, same seed: same vocab file, tokenizer and shards
    manifest = shard_format.read_manifest(str(out))
    assert manifest["params"]["vocab_file"] == str(built / "vocab.txt")


def test_bad_arguments_exit_2(corpus, built, tmp_path):
    assert (
        main(["build", "--input", str(tmp_path / "nothing*.txt"), "--output", str(tmp_path)]) == 2
    )
    assert main(["build", "--input", corpus, "--output", str(built)]) == 2  # would mix builds
    assert main(["build", "--input", corpus, "--output", str(tmp_path), "--dupe_factr", "3"]) == 2
    assert (
        main(["build", "--input", corpus, "--output", str(tmp_path), "--masked_lm_prob", "0"]) == 2
    )


def run_cli(corpus, out, *beam_args) -> subprocess.CompletedProcess:
    """The build as a user runs it; Beam's log goes to OUT.log, beside OUT."""
    log = Path(f"{out}.log")
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "--input",
        corpus,
        "--output",
        str(out),
        "--log_file",
        str(log),
        *BASE,
        *beam_args,
    ]
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    env.pop("BERT_VERBOSE", None)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:] + log.read_text()[-3000:]
    return done


def same_build(directory: Path, expected: Path) -> bool:
    """The same shards and vocab as ``expected``, and the same manifest but for
    ``params.input`` (the files' names)."""

    def manifest(d: Path) -> dict:
        m = json.loads((d / "manifest.json").read_text())
        m["params"].pop("input")
        return m

    got, want = digest(directory), digest(expected)
    got.pop("manifest.json"), want.pop("manifest.json")
    return got == want and manifest(directory) == manifest(expected)


def one_file(corpus, directory: Path) -> str:
    """The corpus's documents in one txt file (the documents, so the shards, of ``built``)."""
    documents = [
        "\n".join(sentences)
        for path in sorted(Path(corpus).parent.glob("*.txt"))
        for sentences, _ in read_txt(path.open("rb"))
        if sentences
    ]
    assert len(documents) == 120
    directory.mkdir()
    (directory / "corpus.txt").write_text("\n\n".join(documents) + "\n")
    return str(directory / "corpus.txt")


@pytest.mark.slow
def test_multiprocessing_runner_spreads_one_file_and_gives_identical_bytes(corpus, built, tmp_path):
    """One file read in 12 ranges by 2 worker processes: both read and tokenize part of it,
    and the shards are those of the corpus in 3 files on one in-process worker."""
    single = one_file(corpus, tmp_path / "one")
    done = run_cli(
        single,
        tmp_path / "mp",
        "--input_split_mb",
        "0.005",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
    )
    assert same_build(tmp_path / "mp", built)
    # The console holds only our timestamped lines; the worker subprocesses' own output
    # (they inherit stderr) is in the log file.
    console = done.stderr.splitlines()
    assert any("done in" in line for line in console), done.stderr
    assert all(re.match(r"\d\d:\d\d:\d\d (?!WARNING|ERROR)", line) for line in console), done.stderr
    ranges = -(-Path(single).stat().st_size // 5000)
    assert ranges > 10 and f"read in {ranges} range(s)" in done.stderr, done.stderr
    log = (tmp_path / "mp.log").read_text()
    assert "sdk_worker" in log
    readers = set(re.findall(r"read .*corpus.txt, bytes .*\(process (\d+)\)", log))
    tokenizers = set(re.findall(r"tokenized \d+ documents in a bundle \(process (\d+)\)", log))
    assert len(readers) == 2 and tokenizers == readers, log[-3000:]


def test_a_failed_build_prints_one_line_and_logs_the_traceback(
    corpus, tmp_path, monkeypatch, capfd
):
    import apache_beam as beam

    def broken_graph(p, config, plan):
        def fail(_):
            raise ValueError("boom in a worker")

        return p | beam.Create([1]) | beam.Map(fail)

    monkeypatch.setattr("pipeline.beam.build.build_graph", broken_graph)
    monkeypatch.delenv("BERT_VERBOSE", raising=False)
    log = tmp_path / "build.log"
    argv = ["build", "--input", corpus, "--output", str(tmp_path / "out"), "--log_file", str(log)]
    assert main([*argv, *BASE]) == 1
    console = capfd.readouterr().err
    assert "build failed: " in console and "boom in a worker" in console and str(log) in console
    assert "Traceback" not in console and "Traceback" in log.read_text()


@pytest.mark.slow
def test_dask_runner_gives_identical_bytes(corpus, built, tmp_path):
    pytest.importorskip("distributed", reason=DASK_EXTRA)
    run_cli(corpus, tmp_path / "dask", "--runner=apache_beam.runners.dask.dask_runner.DaskRunner")
    assert digest(tmp_path / "dask") == digest(built)
    manifest = json.loads((tmp_path / "dask" / "manifest.json").read_text())
    assert manifest["num_rows"] > 100


def test_stats_command_writes_plots(built, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="--plot draws with matplotlib (the [train] extra)")
    assert main(["stats", str(built), "--plot", "--plot_dir", str(tmp_path)]) == 0
    assert "random_next_share" in capsys.readouterr().out
    for name in ("lengths.png", "masking.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_names_a_corrupt_shard(built, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    shard = copy / "shard-00001-of-00003.arrow"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match="shard-00001-of-00003"):
        compute_stats(str(copy))
    assert main(["stats", str(copy)]) == 1


def test_jsonl_input_counts_skipped_records(tmp_path):
    rng = random.Random(1)
    lines = []
    for _ in range(40):
        text = " ".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 15))).capitalize() + "."
            for _ in range(rng.randint(2, 8))
        )
        lines.append(json.dumps({"body": text}))
    lines += ["{broken", json.dumps({"other": 1}), json.dumps({"body": "   "})]
    (tmp_path / "docs.jsonl").write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    out = tmp_path / "out"
    args = [
        "--input_format",
        "jsonl",
        "--text_field",
        "body",
        "--vocab_size",
        "150",
        "--dupe_factor",
        "2",
        "--max_seq_length",
        "32",
        "--num_shards",
        "2",
    ]
    assert (
        main(["build", "--input", str(tmp_path / "docs.jsonl"), "--output", str(out), *args]) == 0
    )
    manifest = shard_format.verify_directory(str(out))
    assert manifest["skipped"] == {
        "empty_document": 1,
        "invalid_json": 1,
        "invalid_utf8_record": 1,
        "missing_text_field": 1,
    }
    assert manifest["stats"]["documents"] == 40
    assert manifest["num_rows"] > 40


def test_shards_depend_on_the_documents_not_the_files(corpus, built, tmp_path):
    """One file, the same documents in 8 files in another order under other names, and the
    one file gzipped: the same shards and vocab, byte for byte (a document's id is its
    content; the manifest differs in params.input alone)."""
    one = Path(one_file(corpus, tmp_path / "one"))
    documents = one.read_text().rstrip("\n").split("\n\n")
    shuffled = random.Random(5).sample(documents, len(documents))
    (tmp_path / "eight").mkdir()
    for i in range(8):
        (tmp_path / "eight" / f"part-{7 - i}.txt").write_text("\n\n".join(shuffled[i::8]) + "\n")
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "renamed.txt.gz").write_bytes(gzip.compress(one.read_bytes()))
    for name in ("one", "eight", "gz"):
        out = tmp_path / f"out-{name}"
        argv = ["build", "--input", str(tmp_path / name / "*"), "--output", str(out), *BASE]
        assert main(argv) == 0
        assert same_build(out, built), name


def test_tokenizer_threads_resolution():
    from pipeline.beam.config import resolve_tokenizer_threads

    direct = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
    assert resolve_tokenizer_threads(3, "DataflowRunner", 1, 8) == 3  # asked for: kept
    assert resolve_tokenizer_threads(0, None, 1, 8) == 8  # one local worker: every core
    assert resolve_tokenizer_threads(0, direct, 2, 8) == 4  # cores shared by the workers
    assert resolve_tokenizer_threads(0, "DirectRunner", 0, 8) == 1  # 0 workers: one per core
    assert resolve_tokenizer_threads(0, "DirectRunner", 16, 8) == 1
    assert resolve_tokenizer_threads(0, "DataflowRunner", 1, 8) == 1  # a process per core


def test_buckets_hold_at_least_bucket_size_documents(built):
    from pipeline.beam.config import BuildConfig
    from pipeline.beam.instance_steps import num_buckets, split_into_buckets

    assert num_buckets(1191, 1000) == 1  # too few for two: one bucket of all
    assert num_buckets(10**6, 1000) == 10**6 // 1192
    config = BuildConfig(input=("x",), output="x", bucket_size=1000)
    n = 200_000
    ids = [f"wiki/part-{i % 7}.txt:{i}" for i in range(n)]
    batch = TokenizedBatch(ids, np.ones(n, np.uint16), np.ones(n, np.int64), np.ones(n, np.int64))
    sizes = [len(part.doc_ids) for _, part in split_into_buckets(batch, n, config)]
    assert len(sizes) == num_buckets(n, 1000) and sum(sizes) == n
    assert min(sizes) >= 1000, min(sizes)
    # The manifest records the spread (here: 120 documents, bucket size 10).
    buckets = shard_format.read_manifest(str(built))["stats"]["buckets"]
    assert buckets == {
        "count": 3,
        "min_documents": buckets["min_documents"],
        "max_documents": buckets["max_documents"],
    }
    assert 10 <= buckets["min_documents"] <= buckets["max_documents"]


def test_validate_and_inspect_commands(built, tmp_path, capsys):
    import shutil

    import pyarrow as pa

    assert main(["validate", str(built)]) == 0
    assert "rows checked" in capsys.readouterr().out
    assert main(["inspect", str(built), "-n", "2"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 4 and shown[0].startswith("--- shard-00000-of-00003.arrow row 0:")
    assert shown[1].startswith("[CLS] ") and shown[1].endswith(" [SEP]") and ">" in shown[1]
    assert main(["inspect", str(built), "-n", "20"]) == 0
    pieces = capsys.readouterr().out
    assert " ##" in pieces  # WordPieces, as the help says
    assert main(["inspect", str(built), "-n", "20", "--words"]) == 0
    words = capsys.readouterr().out
    assert " ##" not in words.replace(">##", "").replace("] ##", "")  # joined unless by a mask
    assert len(words) < len(pieces)

    # A shard whose bytes match its manifest entry but whose rows are wrong: a masked
    # position past the end of its row. Only the row checks can catch it.
    bad = tmp_path / "bad"
    shutil.copytree(built, bad)
    name = "shard-00001-of-00003.arrow"
    table = pa.ipc.open_stream((bad / name).read_bytes()).read_all()
    positions = table.column("masked_lm_positions").combine_chunks()
    values = positions.values.to_numpy().copy()
    values[0] = 200  # every row is shorter than 48 tokens
    broken = pa.ListArray.from_arrays(
        positions.offsets, pa.array(values, positions.type.value_type)
    )
    table = table.set_column(2, table.schema.field(2), broken)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    (bad / name).write_bytes(data)
    manifest = json.loads((bad / "manifest.json").read_text())
    entry = next(e for e in manifest["shards"] if e["name"] == name)
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (bad / "manifest.json").write_text(json.dumps(manifest))
    assert main(["validate", str(bad)]) == 1
    error = capsys.readouterr().err
    assert name in error and "masked_lm_positions" in error and "row 0" in error

    # A truncated shard fails on its size, named.
    (bad / name).write_bytes(data[:-100])
    assert main(["validate", str(bad)]) == 1
    assert name in capsys.readouterr().err


def test_bad_txt_input_is_counted_and_the_job_completes(tmp_path, capsys):
    corpus = tmp_path / "bad"
    make_corpus(corpus, n_docs=30, n_files=1)
    (corpus / "empty.txt").write_bytes(b"")
    (corpus / "blank.txt").write_text("   \n\t\n\n  \n", encoding="utf-8")
    long_line = " ".join(["river"] * 200_000)  # 1.2 MB on one line
    (corpus / "odd.txt").write_bytes(
        b"Good line one.\nBad \xff\xfe bytes here.\nA NUL \x00 inside.\n\n"
        b"One sentence document.\n\n"
        + ("x" * 10_000).encode()
        + b" is a long word.\nMixed \xe6\x9d\xb1\xe4\xba\xac "
        b"\xd0\x9c\xd0\xbe\xd1\x81\xd0\xba\xd0\xb2\xd0\xb0 caf\xc3\xa9 \xf0\x9f\x98\x80.\n\n"
        + long_line.encode()
        + b"\nAnd a second sentence.\n"
    )
    out = tmp_path / "out"
    args = [
        "--vocab_size",
        "300",
        "--dupe_factor",
        "2",
        "--max_seq_length",
        "48",
        "--num_shards",
        "2",
        "--bucket_size",
        "5",
    ]
    assert main(["build", "--input", str(corpus / "*.txt"), "--output", str(out), *args]) == 0
    manifest = shard_format.read_manifest(str(out))
    assert manifest["skipped"] == {"file_without_documents": 2, "invalid_utf8_line": 1}
    noticed = manifest["stats"]["input"]
    assert noticed["sentences_with_nul"] == 1 and noticed["long_sentences"] == 1
    assert noticed["one_sentence_documents"] >= 1 and noticed["unk_tokens"] >= 1
    assert manifest["stats"]["documents"] == 34  # 30 generated + 4 in odd.txt
    # Complete, verified shards; no part file or temporary file left behind.
    assert main(["validate", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert all((out / e["name"]).stat().st_size > 0 for e in manifest["shards"])
    capsys.readouterr()


def test_special_token_text_in_the_corpus_is_text_in_the_rows(tmp_path):
    """Code-heavy text with literal "[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]": Google's
    tokenizer splits them ("[", "mask", "]"), so no special id lands mid-row."""
    corpus = tmp_path / "in"
    make_corpus(corpus, n_docs=24, n_files=1)
    lines = [
        "Replace [MASK] with the word.",
        "Rows start with [CLS] and end [SEP].",
        "Pad with [PAD] and [UNK] marks unknown words.",
        "x = tokens[MASK] [SEP][CLS]",
    ]
    (corpus / "code.txt").write_text("\n\n".join("\n".join(lines) for _ in range(6)) + "\n")
    out = tmp_path / "out"
    assert (
        main(
            [
                "build",
                "--input",
                str(corpus / "*.txt"),
                "--output",
                str(out),
                *SMALL,
                "--vocab_size",
                "400",
            ]
        )
        == 0
    )
    assert main(["validate", str(out)]) == 0
    assert "mask" in read_vocab(out / "vocab.txt")  # counted as a word, like any other
    special = shard_format.read_manifest(str(out))["vocab"]["special_ids"]
    for entry in shard_format.read_manifest(str(out))["shards"]:
        for row in shard_format.iter_rows(shard_format.open_shard(out / entry["name"])):
            ids, segments = row["input_ids"].astype(np.int64), row["segment_ids"]
            text = np.ones(len(ids), dtype=bool)
            text[[0, int(np.flatnonzero(segments)[0]) - 1, len(ids) - 1]] = False
            text[row["masked_lm_positions"]] = False
            others = [special[name] for name in ("pad", "cls", "sep", "mask")]
            assert not np.isin(ids[text], others).any(), ids
            assert not np.isin(row["masked_lm_ids"], others).any()


def test_a_killed_writers_temporary_file_is_removed(corpus, built, tmp_path, monkeypatch):
    """A worker killed mid-write leaves write_atomic's temporary file; the runner writes
    the file again under another name. The manifest step removes the orphan, and so
    does the next build's start."""
    import pipeline.beam.shard_steps

    out = tmp_path / "out"
    out.mkdir()
    (out / ".shard-00001-of-00003.arrow.0123abcd.tmp").write_bytes(b"an earlier build's")
    real = pipeline.beam.shard_steps.write_atomic

    def killed_once_then_retried(path, data):
        name = os.path.basename(path)
        if name.startswith(".shard-") and not any(out.glob(f".{name}.*.tmp")):
            (out / f".{name}.deadbeef.tmp").write_bytes(b"half a part")  # the killed attempt
        return real(path, data)

    monkeypatch.setattr(pipeline.beam.shard_steps, "write_atomic", killed_once_then_retried)
    assert main(["build", "--input", corpus, "--output", str(out), *BASE]) == 0
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []
    assert digest(out) == digest(built)


def test_shards_written_in_parts_hold_the_rows_of_a_whole_write(
    corpus, built, tmp_path, monkeypatch
):
    import pyarrow as pa

    import pipeline.beam.memory
    import pipeline.beam.shard_steps

    # 3 shards are written in parts by default (fewer than PARALLEL_WRITES); with
    # PARALLEL_WRITES = 1 each shard is one write. Same rows, same order.
    assert pipeline.beam.shard_steps.parts_per_shard(3) > 1
    monkeypatch.setattr(pipeline.beam.memory, "PARALLEL_WRITES", 1)
    whole = tmp_path / "whole"
    assert main(["build", "--input", corpus, "--output", str(whole), *BASE]) == 0
    for i in range(3):
        name = shard_format.shard_name(i, 3)
        parts = pa.ipc.open_stream((built / name).read_bytes()).read_all()
        single = pa.ipc.open_stream((whole / name).read_bytes()).read_all()
        assert parts.num_rows == single.num_rows > 0
        assert parts.combine_chunks().equals(single.combine_chunks())


def jsonl_corpus(path: Path, n_docs=40, seed=3) -> Path:
    rng = random.Random(seed)
    lines = []
    for i in range(n_docs):
        text = " ".join(
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 15))).capitalize() + "."
            for _ in range(rng.randint(2, 8))
        )
        lines.append(json.dumps({"id": i, "text": text}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


SMALL = ["--vocab_size", "150", "--dupe_factor", "2", "--max_seq_length", "32", "--num_shards", "2"]


def test_jsonl_format_is_inferred_from_the_extension(tmp_path):
    docs = jsonl_corpus(tmp_path / "in" / "docs.jsonl")
    out = tmp_path / "out"
    assert main(["build", "--input", str(docs), "--output", str(out), *SMALL]) == 0
    manifest = shard_format.read_manifest(str(out))
    assert manifest["params"]["input_format"] == "jsonl"
    assert manifest["stats"]["documents"] == 40  # not one document of '{ " id "' tokens
    assert "{" not in read_vocab(out / "vocab.txt")


def test_a_format_that_contradicts_the_content_stops_the_build(tmp_path, capfd):
    docs = jsonl_corpus(tmp_path / "in" / "docs.jsonl")
    out = tmp_path / "out"
    capfd.readouterr()
    assert (
        main(["build", "--input", str(docs), "--output", str(out), "--input_format", "txt", *SMALL])
        == 2
    )
    err = capfd.readouterr().err
    assert f"{docs}: read as txt (--input_format txt)" in err and "--input_format jsonl" in err
    assert "Traceback" not in err and not out.exists()
    # A .txt name on JSON Lines content, and a mix of extensions, stop it too.
    named_txt = tmp_path / "in2" / "docs.txt"
    named_txt.parent.mkdir()
    named_txt.write_bytes(docs.read_bytes())
    assert main(["build", "--input", str(named_txt), "--output", str(out), *SMALL]) == 2
    assert "inferred from the extension" in capfd.readouterr().err
    make_corpus(tmp_path / "in", n_docs=4, n_files=1)
    assert main(["build", "--input", str(tmp_path / "in" / "*"), "--output", str(out), *SMALL]) == 2
    assert "--input mixes formats" in capfd.readouterr().err and not out.exists()


def test_a_contradicting_file_after_the_first_fails_the_job_naming_it(tmp_path, capfd):
    make_corpus(tmp_path / "in", n_docs=20, n_files=1)  # part-0.txt: checked up front
    late = jsonl_corpus(tmp_path / "in" / "zz-late.txt")  # checked as it is read
    out = tmp_path / "out"
    capfd.readouterr()
    assert (
        main(["build", "--input", str(tmp_path / "in" / "*.txt"), "--output", str(out), *SMALL])
        == 1
    )
    err = capfd.readouterr().err
    assert f"{late}: read as txt" in err and "Traceback" not in err
    assert not (out / "manifest.json").exists()


def test_txt_files_of_one_document_each_get_a_warning(tmp_path, capfd):
    directory = tmp_path / "in"
    make_corpus(directory, n_docs=30, n_files=2)
    (directory / "one.txt").write_text("Just one document.\nWith two sentences.\n")
    capfd.readouterr()
    out = tmp_path / "out"
    assert main(["build", "--input", str(directory / "*.txt"), "--output", str(out), *SMALL]) == 0
    assert "1 of 3 txt input file(s) were each read as ONE document" in capfd.readouterr().err
    assert shard_format.read_manifest(str(out))["stats"]["input"]["single_document_files"] == 1


def test_a_build_of_zero_rows_exits_2_saying_why_and_leaves_nothing(tmp_path, capfd):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.txt").write_bytes(b"\n\n")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"{token}\n" for token in [*SPECIAL_TOKENS, "the", "river"]))
    out = tmp_path / "out"
    capfd.readouterr()
    assert (
        main(
            [
                "build",
                "--input",
                str(tmp_path / "in" / "*.txt"),
                "--output",
                str(out),
                "--vocab_file",
                str(vocab),
                *SMALL,
            ]
        )
        == 2
    )
    err = capfd.readouterr().err
    assert "0 documents -> 0 rows" in err and "file_without_documents" in err
    assert "Traceback" not in err and not out.exists()  # no directory of partial files
    # Without --vocab_file (no words to learn a vocab from), the same.
    assert (
        main(["build", "--input", str(tmp_path / "in" / "*.txt"), "--output", str(out), *SMALL])
        == 2
    )
    assert "0 documents -> 0 rows" in capfd.readouterr().err and not out.exists()
    # An output directory that was there before stays, empty as it was.
    out.mkdir()
    assert (
        main(
            [
                "build",
                "--input",
                str(tmp_path / "in" / "*.txt"),
                "--output",
                str(out),
                "--vocab_file",
                str(vocab),
                *SMALL,
            ]
        )
        == 2
    )
    assert list(out.iterdir()) == []


def binary_file(path: Path, size=100_000, seed=5) -> Path:
    """Random bytes: its "lines" (cut at each 0x0a byte) are almost all invalid UTF-8."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def test_a_binary_input_file_stops_the_build_naming_it(tmp_path, capfd):
    make_corpus(tmp_path / "in", n_docs=20, n_files=1)  # part-0.txt: text
    out = tmp_path / "out"
    # Named .txt, or picked up by a glob: read as text, it would make junk rows.
    first = binary_file(tmp_path / "in" / "a-binary.txt")  # the first file: checked up front
    capfd.readouterr()
    assert (
        main(["build", "--input", str(tmp_path / "in" / "*.txt"), "--output", str(out), *SMALL])
        == 2
    )
    err = capfd.readouterr().err
    assert f"{first}: " in err and "not UTF-8" in err and "Traceback" not in err
    assert not out.exists()
    first.unlink()
    late = binary_file(tmp_path / "in" / "zz-binary.txt")  # checked as it is read
    assert (
        main(["build", "--input", str(tmp_path / "in" / "*.txt"), "--output", str(out), *SMALL])
        == 1
    )
    err = capfd.readouterr().err
    assert f"{late}: " in err and "not UTF-8" in err and "Traceback" not in err
    assert not out.exists()  # nothing half-written: the vocab and parts the job wrote are gone


def test_a_huge_line_gets_a_console_warning(tmp_path, capfd):
    make_corpus(tmp_path / "in", n_docs=20, n_files=1)
    huge = tmp_path / "in" / "huge.txt"
    huge.write_text("A first line.\n" + " ".join(["river"] * 200_000) + "\n")  # 1.2 MB line
    out = tmp_path / "out"
    capfd.readouterr()
    assert (
        main(["build", "--input", str(tmp_path / "in" / "*.txt"), "--output", str(out), *SMALL])
        == 0
    )
    err = capfd.readouterr().err
    assert "1 sentence(s) of 1,000,000 characters or more" in err
    assert shard_format.read_manifest(str(out))["stats"]["input"]["long_sentences"] == 1


def test_a_misspelt_beam_option_stops_the_build(corpus, tmp_path, capfd):
    out = tmp_path / "out"
    capfd.readouterr()
    for arg, says in [
        ("--runer=DataflowRunner", "unknown option --runer (did you mean --runner?)"),
        (
            "--runner=DataflowRuner",
            "--runner=DataflowRuner is not a Beam runner (did you mean DataflowRunner?)",
        ),
        ("--direct_num_worker=2", "--direct_num_worker (did you mean --direct_num_workers?)"),
    ]:
        assert main(["build", "--input", corpus, "--output", str(out), arg, *BASE]) == 2, arg
        err = capfd.readouterr().err
        assert says in err and "Traceback" not in err, err
        assert not out.exists()
    # Options of the chosen runner are known (its module is imported to learn them).
    check_beam_options(
        [
            "--runner=FlinkRunner",
            "--flink_master=localhost:8081",
            "--environment_type=LOOPBACK",
            "--parallelism=2",
        ]
    )
    pytest.importorskip("distributed", reason=DASK_EXTRA)
    check_beam_options(
        [
            "--runner=apache_beam.runners.dask.dask_runner.DaskRunner",
            "--dask_client_address=localhost:8786",
        ]
    )


def test_config_file_gives_options_flags_override_it(corpus, tmp_path, capfd):
    from pipeline.beam.config import parse_build_args

    path = tmp_path / "build.json"
    path.write_text(
        json.dumps(
            {
                "input": [corpus],
                "output": "o",
                "dupe_factor": 4,
                "do_whole_word_mask": True,
                "num_shards": 2,
            }
        )
    )
    config, beam_args = parse_build_args(
        ["--config", str(path), "--num_shards", "5", "--runner=DirectRunner"]
    )
    assert (config.input, config.output, config.dupe_factor) == ((corpus,), "o", 4)
    assert config.do_whole_word_mask and config.num_shards == 5
    assert beam_args == ["--runner=DirectRunner"]
    out = tmp_path / "out"
    for content, says in [
        ('{"dupe_factr": 3}', "unknown key(s) ['dupe_factr'] (did you mean 'dupe_factor'?)"),
        ('{"dupe_factor": 3', "not valid JSON"),
        ('{"masked_lm_prob": 0}', "--masked_lm_prob: invalid value 0"),
    ]:
        path.write_text(content)
        capfd.readouterr()
        assert main(["build", "--config", str(path), "--input", corpus, "--output", str(out)]) == 2
        err = capfd.readouterr().err
        assert says in err and "Traceback" not in err, err
        assert str(path) in err or "masked_lm_prob" in content
    assert main(["build", "--input", corpus]) == 2
    assert "missing required option(s) --output" in capfd.readouterr().err


def test_compressed_inputs_are_read_as_the_plain_files(tmp_path):
    """.gz (and Beam's other suffixes) are decompressed by FileSystems; the format is the name's
    without the suffix. Beam's decompressing file cannot be iterated, only read by lines."""
    import gzip

    plain = tmp_path / "plain"
    make_corpus(plain, n_docs=30, n_files=1)
    jsonl_corpus(plain / "docs.jsonl", n_docs=10)
    packed = tmp_path / "packed"
    packed.mkdir()
    for path in plain.iterdir():
        (packed / f"{path.name}.gz").write_bytes(gzip.compress(path.read_bytes()))
    for name, directory in (("txt", plain), ("txt.gz", packed)):
        suffix = "" if name == "txt" else ".gz"
        out = tmp_path / f"out-{name}"
        pattern = str(directory / f"*.txt{suffix}")
        assert main(["build", "--input", pattern, "--output", str(out), *SMALL]) == 0
        assert shard_format.read_manifest(str(out))["stats"]["documents"] == 30
        out = tmp_path / f"out-jsonl-{name}"
        pattern = str(directory / f"*.jsonl{suffix}")
        assert main(["build", "--input", pattern, "--output", str(out), *SMALL]) == 0
        assert shard_format.read_manifest(str(out))["stats"]["documents"] == 10


def test_copies_of_a_document_are_kept_and_counted(corpus, tmp_path):
    """Exact copies share a content id: each still makes its own rows (numbered apart, so
    with other seeds), and the manifest counts the copies in stats.input."""
    single = Path(one_file(corpus, tmp_path / "one"))
    documents = single.read_text().rstrip("\n").split("\n\n")
    (tmp_path / "copies").mkdir()
    (tmp_path / "copies" / "a.txt").write_text("\n\n".join(documents + documents[:5]) + "\n")
    (tmp_path / "copies" / "b.txt").write_text(documents[0] + "\n")
    for name in ("one", "copies"):
        argv = [
            "build",
            "--input",
            str(tmp_path / name / "*.txt"),
            "--output",
            str(tmp_path / f"out-{name}"),
            *BASE,
        ]
        assert main(argv) == 0
    plain, copies = (
        shard_format.read_manifest(str(tmp_path / f"out-{n}")) for n in ("one", "copies")
    )
    assert copies["stats"]["documents"] == 126
    assert copies["stats"]["input"]["duplicate_documents"] == 6
    assert "duplicate_documents" not in plain["stats"]["input"]
    assert copies["num_rows"] > plain["num_rows"]


def test_rows_through_a_spool_or_the_shuffle_give_the_same_bytes(
    corpus, built, tmp_path, monkeypatch
):
    """The DirectRunner sends rows through spool files by default (--spool auto); through
    its shuffle (no) the shards are the same, and no spool file is left either way."""
    from pipeline.beam.spool import RowSpool

    closed = []
    real_close = RowSpool.close
    monkeypatch.setattr(RowSpool, "close", lambda self: closed.append(1) or real_close(self))
    for spool in ("no", "yes"):
        out = tmp_path / spool
        assert (
            main(["build", "--input", corpus, "--output", str(out), "--spool", spool, *BASE]) == 0
        )
        assert same_build(out, built) and not list(out.glob(".*")), spool
        assert bool(closed) == (spool == "yes")
    with pytest.raises(SystemExit, match="2"):
        main(["build", "--input", corpus, "--output", str(tmp_path / "x"), "--spool", "maybe"])


def test_the_memory_check_refuses_a_local_build_that_would_not_fit(
    corpus, tmp_path, monkeypatch, capfd
):
    """Exit 2 before anything is written, naming the estimate, the memory available and the
    Dask command; --force builds anyway; other runners are not checked."""
    from pipeline.beam import sizing

    monkeypatch.setattr(sizing, "available_bytes", lambda: 100_000_000)  # 0.1 GB
    monkeypatch.delenv("BERT_VERBOSE", raising=False)
    out = tmp_path / "out"
    assert main(["build", "--input", corpus, "--output", str(out), *BASE]) == 2
    err = capfd.readouterr().err
    assert (
        "the local runner would need about 0.4 GB for 0.1 MB" in err
        and "0.1 GB are available" in err
    )
    assert "--runner=apache_beam.runners.dask.dask_runner.DaskRunner" in err and "--force" in err
    assert not out.exists()
    assert main(["build", "--input", corpus, "--output", str(out), "--force", *BASE]) == 0
    files = [("a.txt", 10**9), ("b.txt.gz", 10**9)]  # a compressed file counts 3x
    assert sizing.text_bytes(files) == 4 * 10**9
    with pytest.raises(sizing.MemoryCheckError, match=r"4,000\.0 MB of input"):
        sizing.check_local_memory(BuildConfig(input=("x",), output="x"), files, None, 2, 10**9)
    assert (
        sizing.check_local_memory(
            BuildConfig(input=("x",), output="x"), files, "DataflowRunner", 2, 10**9
        )
        is None
    )


def test_a_dask_build_gets_partitions_of_8_mb_at_most_one_per_input_range():
    from pipeline.beam.sizing import dask_partitions

    dask = "apache_beam.runners.dask.dask_runner.DaskRunner"
    assert dask_partitions([], dask, 192) == ["--dask_npartitions=192"]  # size unknown
    assert dask_partitions([], dask, 480, 500 * 10**6) == ["--dask_npartitions=60"]
    assert dask_partitions([], dask, 1024, 20 * 10**9) == ["--dask_npartitions=1024"]
    assert dask_partitions([], dask, 3, 1000) == ["--dask_npartitions=1"]
    assert dask_partitions(["--dask_partition_size=4"], dask, 192) == []
    assert dask_partitions(["--dask_npartitions=8"], dask, 192) == []
    assert dask_partitions([], None, 192) == [] == dask_partitions([], "DataflowRunner", 5)


def test_a_dask_curate_shuffles_in_partitions_of_its_input_size():
    from pipeline.beam.sizing import dask_partitions

    dask = "apache_beam.runners.dask.dask_runner.DaskRunner"
    mb64 = 64 << 20
    assert dask_partitions([], dask, 480, 500 * 10**6, mb64) == [
        "--dask_npartitions=60",
        "--dask_shuffle_partitions=8",
    ]
    assert dask_partitions([], dask, 3, 1000, mb64) == [
        "--dask_npartitions=1",
        "--dask_shuffle_partitions=1",
    ]
    given = ["--dask_shuffle_partitions=5"]
    assert dask_partitions(given, dask, 480, 500 * 10**6, mb64) == ["--dask_npartitions=60"]
    with pytest.raises(ValueError, match="--dask_shuffle_partitions must be 1 or more, got 0"):
        dask_partitions(["--dask_shuffle_partitions=0"], dask, 480, 500 * 10**6, mb64)
    assert dask_partitions([], "DataflowRunner", 480, 500 * 10**6, mb64) == []
