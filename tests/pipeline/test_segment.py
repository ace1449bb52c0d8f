"""Whole-word masking of Chinese with a word segmenter (pipeline/core/segment.py, --wwm_segmenter).

The corpus is tests/data/chinese/sample.jsonl (our own text, 18 documents, ~5 kB). Tests that
need jieba skip on the base install (pip install -e '.[cjk]' installs it).
"""

import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.beam.config import parse_build_args
from pipeline.beam.document_steps import DocumentBatch, Tokenize, TokenizedBatch
from pipeline.cli.main import main
from pipeline.core import segment
from pipeline.core.masking import MaskingConfig, MaskingVocab, mask_flat, num_to_predict
from pipeline.core.nsp import assemble_joins, assemble_rows
from pipeline.core.rng import shard_keys
from pipeline.core.vocab import SPECIAL_TOKENS
from pipeline.shards import shard_format

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "chinese" / "sample.jsonl"
CHINESE_PUNCTUATION = set("，。！？、：；“”")
BUILD = [
    "--vocab_size",
    "800",
    "--dupe_factor",
    "8",
    "--max_seq_length",
    "64",
    "--num_shards",
    "2",
    "--do_whole_word_mask",
    "true",
    "--random_seed",
    "5",
]


def needs_jieba():
    return pytest.importorskip("jieba", reason="pip install 'bert-pipeline[cjk]'")


# ----------------------------------------------------------------------------- the algorithm


def test_masking_takes_the_segmenters_words_whole():
    # [CLS] 我 喜 欢 play ##ing 足 球 [SEP] 中 文 [SEP]; joins: 喜欢, 足球, 中文 (over the
    # [SEP] nothing joins); ##ing joins play by the vocab.
    tokens = [*SPECIAL_TOKENS, "我", "喜", "欢", "play", "##ing", "足", "球", "中", "文"]
    vocab = MaskingVocab.from_tokens(tokens)
    ids = {t: i for i, t in enumerate(tokens)}
    row = [ids[t] for t in "[CLS] 我 喜 欢 play ##ing 足 球 [SEP] 中 文 [SEP]".split()]
    joins = np.array([0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0], dtype=bool)
    units = [{1}, {2, 3}, {4, 5}, {6, 7}, {9, 10}]
    config = MaskingConfig(masked_lm_prob=0.35, max_predictions_per_seq=4, do_whole_word_mask=True)
    rows = 400
    flat = np.tile(np.array(row, dtype=np.int32), rows)
    offsets = np.arange(rows + 1, dtype=np.int64) * len(row)
    keys = shard_keys(3, "doc", 0, rows)
    _, selected = mask_flat(flat, offsets, keys, config, vocab, np.tile(joins, rows))
    seen = set()
    for r in range(rows):
        chosen = {int(p) - r * len(row) for p in selected if r * len(row) <= p < (r + 1) * len(row)}
        assert chosen == set().union(*[u for u in units if u & chosen]), (r, chosen)
        assert len(chosen) <= 4  # round(12 * 0.35) = 4, never overshot
        seen |= {frozenset(u) for u in units if u <= chosen}
    assert len(seen) == len(units)  # every unit is drawn sometimes
    with pytest.raises(ValueError, match="word_joins"):
        mask_flat(flat, offsets, keys, config, vocab, joins)  # one flag per id


def test_assemble_joins_lays_out_flags_like_ids_and_cuts_at_a_and_b():
    tokens = np.arange(10, 20, dtype=np.int32)
    joins = np.array([0, 1, 1, 0, 1, 0, 1, 1, 1, 0], dtype=bool)
    plans = np.array([[1, 3, 4, 8, 0], [2, 3, 4, 8, 1]])  # A, B: tokens 1..2, 4..7; 2, 4..7
    ids, _, _ = assemble_rows(tokens, plans, _special())
    laid = assemble_joins(joins, plans)
    assert ids.tolist() == [1, 11, 12, 2, 14, 15, 16, 17, 2, 1, 12, 2, 14, 15, 16, 17, 2]
    # A's and B's first tokens (12 in row 2, 14) never join what precedes them in the row.
    assert laid.astype(int).tolist() == [0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0]


def _special():
    from pipeline.core.nsp import SpecialIds

    return SpecialIds(cls_id=1, sep_id=2)


def test_word_joins_follow_jieba_on_the_original_text():
    jieba = needs_jieba()
    sentence = "我们用BERT模型做自然语言处理。"
    tokens = [*SPECIAL_TOKENS, *"我们用模型做自然语言处理。", "bert"]
    tokenizer = _tokenizer(tokens)
    encoding = tokenizer.encode(sentence, add_special_tokens=False)
    joins = segment.word_joins([sentence], [encoding.offsets], segment.load_segmenter("jieba"))
    # One unit per jieba word of the text; "bert" (Latin) never joins a neighbour.
    units, position = [], 0
    for word in jieba.lcut(sentence):
        pieces = len(tokenizer.encode(word, add_special_tokens=False).ids)
        units.append(list(range(position, position + pieces)))
        position += pieces
    expected = [k > 0 and len(u) > 1 for u in units for k in range(len(u))]
    assert joins.tolist() == expected
    assert sum(joins) >= 3  # 我们, 模型, 自然语言 ... are words of several characters


def _tokenizer(tokens):
    from pipeline.core.vocab import build_tokenizer

    return build_tokenizer(list(tokens), True, specials_in_text=False)


def test_a_mixed_row_follows_both_rules():
    needs_jieba()
    tokens = [*SPECIAL_TOKENS, *"我喜欢踢足球也看书", "play", "##ing"]
    batch = DocumentBatch(["d:0"], [["我喜欢playing足球。"]])
    tokenize = Tokenize(True, threads=1, segmenter="jieba")
    (out, *_) = [t for t in tokenize.process(batch, tokens) if isinstance(t, TokenizedBatch)]
    names = [tokens[i] for i in out.ids.tolist()]
    assert names == ["我", "喜", "欢", "play", "##ing", "足", "球", "[UNK]"]
    # jieba: 我 / 喜欢 / playing / 足球 / 。 -- the Latin word joins by "##", not by jieba.
    assert out.joins.tolist() == [False, False, True, False, False, False, True, False]
    vocab = MaskingVocab.from_tokens(tokens)
    starts = ~(vocab.is_continuation[out.ids] | out.joins)
    assert starts.tolist() == [True, True, False, True, False, True, False, True]


def test_a_missing_segmenter_names_the_extra(monkeypatch, tmp_path, capfd):
    monkeypatch.setitem(sys.modules, "jieba", None)  # import jieba raises ImportError
    with pytest.raises(ImportError, match=r"bert-pipeline\[cjk\]"):
        segment.load_segmenter("jieba")
    argv = [
        "build",
        "--input",
        str(SAMPLE),
        "--output",
        str(tmp_path / "out"),
        *BUILD,
        "--wwm_segmenter",
        "jieba",
    ]
    assert main(argv) == 2
    assert "pip install 'bert-pipeline[cjk]'" in capfd.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_segmenter_needs_whole_word_masking():
    with pytest.raises(ValueError, match="--do_whole_word_mask true"):
        parse_build_args(["--input", "x", "--output", "y", "--wwm_segmenter", "jieba"])
    config, _ = parse_build_args(["--input", "x", "--output", "y"])
    assert "wwm_segmenter" not in config.params()  # builds without one keep their manifest


# ----------------------------------------------------------------------------- the build


@pytest.fixture(scope="module")
def chinese_build(tmp_path_factory):
    needs_jieba()
    out = tmp_path_factory.mktemp("zh") / "shards"
    argv = [
        "build",
        "--input",
        str(SAMPLE),
        "--output",
        str(out),
        *BUILD,
        "--wwm_segmenter",
        "jieba",
    ]
    assert main(argv) == 0
    return out


def rows_of(directory: Path):
    manifest = shard_format.read_manifest(str(directory))
    vocab = (directory / "vocab.txt").read_text(encoding="utf-8").split("\n")
    rows = []
    for entry in manifest["shards"]:
        table = pa.ipc.open_stream(pa.memory_map(str(directory / entry["name"]))).read_all()
        rows += table.to_pylist()
    return manifest, vocab, rows


def test_masks_cover_whole_jieba_words(chinese_build):
    jieba = needs_jieba()
    _, vocab, rows = rows_of(chinese_build)
    whole = checked = 0
    for row in rows:
        ids = list(row["input_ids"])
        for position, original in zip(
            row["masked_lm_positions"], row["masked_lm_ids"], strict=True
        ):
            ids[position] = original
        masked = set(row["masked_lm_positions"])
        text = [vocab[i] for i in ids]
        # Runs of ideographs between two Chinese punctuation marks are whole jieba blocks
        # of their sentence (jieba cuts at punctuation), so jieba on the run alone finds
        # the words it found on the sentence.
        marks = [p for p, t in enumerate(text) if t in CHINESE_PUNCTUATION]
        for left, right in itertools.pairwise(marks):
            run = text[left + 1 : right]
            if not run or any(len(t) != 1 for t in run):
                continue
            if not segment.is_ideograph(np.array([ord(t) for t in run], dtype=np.uint32)).all():
                continue
            position = left + 1
            for word in jieba.lcut("".join(run)):
                span = set(range(position, position + len(word)))
                covered = span & masked
                assert not covered or covered == span, (word, "".join(run))
                whole += len(word) > 1 and covered == span
                checked += len(word) > 1
                position += len(word)
    assert checked > 300 and whole > 20  # many words of 2+ characters checked, some masked


def test_masked_share_stays_at_masked_lm_prob(chinese_build):
    manifest, _, rows = rows_of(chinese_build)
    lengths = np.array([len(r["input_ids"]) for r in rows])
    masked = sum(len(r["masked_lm_positions"]) for r in rows)
    budget = int(num_to_predict(lengths, MaskingConfig(do_whole_word_mask=True)).sum())
    # Words that would overshoot a row's budget are skipped (Google's rule): slightly under.
    assert 0.9 * budget <= masked <= budget
    assert 0.13 <= masked / lengths.sum() <= 0.16
    params = manifest["params"]
    assert params["wwm_segmenter"] == "jieba"
    assert params["wwm_segmenter_version"] == pytest.importorskip("jieba").__version__


@pytest.mark.slow
def test_two_workers_give_the_same_bytes(chinese_build, tmp_path):
    import subprocess

    out = tmp_path / "mp"
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "build",
        "--input",
        str(SAMPLE),
        "--output",
        str(out),
        *BUILD,
        "--wwm_segmenter",
        "jieba",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
        "--log_file",
        str(tmp_path / "mp.log"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for path in sorted(chinese_build.iterdir()):
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["params"]["wwm_segmenter"] == "jieba"
