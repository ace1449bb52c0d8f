"""What a build says for a user's mistake: a usage error exits 2 naming the option and the
value to pass; input read another way than meant gets a warning saying what happened."""

import json
from pathlib import Path

import pytest

from pipeline.beam.runner import UsageError, usage_message
from pipeline.cli.main import main
from pipeline.core.text import split_sentences
from pipeline.core.wordpiece import VocabSizeError, learn_wordpiece_vocab
from tests.helpers import make_corpus

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "chinese" / "sample.jsonl"
SMALL = ["--dupe_factor", "1", "--max_seq_length", "32", "--num_shards", "1"]


def test_a_vocab_size_below_the_corpus_alphabet_exits_2_naming_the_size_that_fits(tmp_path, capfd):
    """Found only once the words are counted, inside the job; still the user's mistake:
    exit 2, the flag and the smallest size that holds the alphabet, nothing left behind."""
    corpus = make_corpus(tmp_path / "in", n_docs=20, n_files=1)
    counts = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
    with pytest.raises(VocabSizeError) as caught:
        learn_wordpiece_vocab(counts, 10, min_frequency=1)
    assert caught.value.needed == 23  # 5 specials, 10 characters, 8 "##c"
    out = tmp_path / "out"
    capfd.readouterr()
    assert (
        main(["build", "--input", corpus, "--output", str(out), "--vocab_size", "8", *SMALL]) == 2
    )
    err = capfd.readouterr().err
    line = next(x for x in err.splitlines() if "ERROR pipeline:" in x)
    assert "--vocab_size 8 is too small for this corpus" in line
    assert "pass --vocab_size" in line and "or more" in line
    assert "limit_alphabet" not in err and "Traceback" not in err and "[while running" not in line
    assert not out.exists()


def test_a_usage_error_from_a_worker_process_is_found_in_its_traceback_text():
    """The multi-processing DirectRunner re-raises a worker's exception as a RuntimeError
    whose last line is the exception, qualified; other failures are not usage errors."""
    remote = RuntimeError(
        "Pipeline failed\nTraceback (most recent call last):\n  File x\n"
        "pipeline.beam.runner.UsageError: pass --vocab_size 538 or more "
        "[while running 'LearnVocabulary/LearnVocab']"
    )
    assert usage_message(remote) == "pass --vocab_size 538 or more"
    assert usage_message(UsageError("pass --x 5 [while running 'A']")) == "pass --x 5"
    assert usage_message(RuntimeError("Traceback\nValueError: pass --x 5")) is None
    assert usage_message(ValueError("x")) is None


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--vocab_size", "3", "--vocab_size: invalid value 3: must be at least 6"),
        ("--masked_lm_prob", "1.5", "--masked_lm_prob: invalid value 1.5: must be in (0, 1]"),
        ("--num_shards", "0", "--num_shards: invalid value 0: must be in 1..99999"),
    ],
)
def test_an_out_of_range_option_says_what_is_allowed(tmp_path, capfd, flag, value, says):
    capfd.readouterr()
    assert (
        main(
            [
                "build",
                "--input",
                str(tmp_path / "x.txt"),
                "--output",
                str(tmp_path / "o"),
                flag,
                value,
            ]
        )
        == 2
    )
    assert says in capfd.readouterr().err


def test_chinese_as_txt_without_blank_lines_is_read_as_one_document_and_says_so(tmp_path, capfd):
    """The Chinese sample's sentences one per line, with no blank line between its
    documents: txt reads the file as one document. The warning says so, why, and what to
    do; the log names the file and its lines."""
    text = "".join(
        sentence + "\n"
        for line in SAMPLE.read_text(encoding="utf-8").splitlines()
        for sentence in split_sentences(json.loads(line)["text"])
    )
    lines = text.count("\n")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "zh.txt").write_text(text, encoding="utf-8")
    out, log = tmp_path / "out", tmp_path / "build.log"
    capfd.readouterr()
    assert (
        main(
            [
                "build",
                "--input",
                str(tmp_path / "in" / "zh.txt"),
                "--output",
                str(out),
                "--log_file",
                str(log),
                "--vocab_size",
                "700",
                *SMALL,
            ]
        )
        == 0
    )
    err = capfd.readouterr().err
    assert "1 of 1 txt input file(s) were each read as ONE document" in err
    assert "blank line between documents" in err and "jsonl" in err and str(log) in err
    assert f"zh.txt was read as one document of {lines} lines" in log.read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["documents"] == 1
