"""trainer/fillmask.py: held-out sentences, one masked word, the export's exact rank of it."""

import random

import numpy as np
import pytest
import torch

from model import BertConfig, BertForPreTraining
from tests.helpers import build_shards
from trainer import fillmask
from trainer.hf_tokenizer import read_shard_vocab, save_tokenizer

transformers = pytest.importorskip("transformers")

# Words of the test corpus (tests/pipeline/test_build.py), each one token of its vocab.
RANKED = ["king", "queen", "river", "city", "school", "island", "music", "war"]


def write_export(directory, shards, bias_order=()):
    """A tiny random model with the shards' tokenizer; ``bias_order`` tokens get MLM biases
    100, 90, 80, ... (others 0), so they rank 1, 2, 3, ... at every mask."""
    vocab = read_shard_vocab(shards)
    torch.manual_seed(0)
    model = BertForPreTraining(
        BertConfig.preset("tiny", vocab_size=len(vocab.tokens), max_position_embeddings=64)
    )
    with torch.no_grad():
        if bias_order:
            model.cls.predictions.bias.zero_()
        for k, token in enumerate(bias_order):
            model.cls.predictions.bias[vocab.tokens.index(token)] = 100.0 - 10 * k
    model.save_hf(directory)
    save_tokenizer(directory, vocab, model_max_length=64)
    return directory


@pytest.fixture(scope="module")
def export_dir(small_shards, tmp_path_factory):
    return write_export(tmp_path_factory.mktemp("hf"), small_shards)


def test_restore_masked_puts_back_the_original_ids():
    row = {
        "input_ids": np.array([2, 4, 9, 4, 3], dtype=np.uint16),
        "masked_lm_positions": np.array([1, 3], dtype=np.uint8),
        "masked_lm_ids": np.array([7, 8], dtype=np.uint16),
    }
    assert fillmask.restore_masked(row).tolist() == [2, 7, 9, 8, 3]
    assert row["input_ids"].tolist() == [2, 4, 9, 4, 3]  # the row itself is untouched


def test_decode_rank_and_shorten_known_answers():
    assert fillmask.decode_wordpiece(["the", "sch", "##ool", "!"]) == "the school !"
    assert fillmask.rank_of(torch.tensor([0.1, 3.0, 2.0]), 2) == 2
    assert fillmask.rank_of(torch.tensor([0.1, 3.0, 2.0]), 1) == 1
    assert fillmask.rank_of(torch.tensor([0.1, 3.0, 2.0]), 0) == 3
    assert fillmask.shorten("a b [MASK] c d", width=10) == "...b [MASK] c..."
    long = "x" * 300 + " [MASK] " + "y" * 300
    assert "[MASK]" in fillmask.shorten(long) and len(fillmask.shorten(long)) <= 106


def test_shard_sentences_are_unmasked_segments(small_shards):
    sentences = fillmask.shard_sentences(str(small_shards), 60, random.Random(0))
    assert len(sentences) == 60
    assert not any("[MASK]" in s for s in sentences)  # the pipeline's masks were undone
    assert not any("[CLS]" in s or "[SEP]" in s or "##" in s for s in sentences)
    assert sentences == fillmask.shard_sentences(str(small_shards), 60, random.Random(0))


def test_mask_one_word_masks_a_whole_single_token_word(export_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    # Only "queen" is one vocab token with a letter: school ##s, king ##s, "," and "—" are
    # [UNK], "!" is punctuation.
    masked, word = fillmask.mask_one_word("Schools, kings — queen!", tokenizer, random.Random(0))
    assert (masked, word) == ("Schools, kings — [MASK]!", "queen")
    words = {
        fillmask.mask_one_word("The King, 東京 and schools!", tokenizer, random.Random(seed))[1]
        for seed in range(30)
    }
    assert words == {"the", "king", "東", "京"}  # the original text keeps its case
    assert fillmask.mask_one_word("?! ...", tokenizer, random.Random(0)) is None


def test_fill_mask_on_a_tiny_model_reports_a_rank(export_dir):
    examples = [
        ("the ancient [MASK] founded a school .", "king"),
        ("a [MASK] by the river", "city"),
    ]
    results = fillmask.fill_mask_examples(export_dir, examples, top_k=5)
    for result, (text, word) in zip(results, examples, strict=True):
        assert (result["text"], result["true_word"]) == (text, word)
        assert isinstance(result["rank"], int) and 1 <= result["rank"] <= 200
        assert result["words"] == 113 and len(result["predictions"]) == 5  # of 200 ids
        ids = [p["id"] for p in result["predictions"]]
        # Our rank agrees with the pipeline's own order where the word is in its top 5.
        assert (result["true_id"] in ids) == (result["rank"] <= 5)
        if result["rank"] <= 5:
            assert ids[result["rank"] - 1] == result["true_id"]
    with pytest.raises(ValueError, match="2 \\[MASK\\] tokens"):
        fillmask.fill_mask_examples(export_dir, [("[MASK] [MASK]", "king")])
    with pytest.raises(ValueError, match="not a token"):
        fillmask.fill_mask_examples(export_dir, [("a [MASK] .", "schools")])


def test_biased_model_gives_the_exact_ranks(small_shards, tmp_path):
    export_dir = write_export(tmp_path / "hf", small_shards, bias_order=RANKED)
    text = "the ancient [MASK] founded a school ."
    results = fillmask.fill_mask_examples(
        export_dir, [(text, "king"), (text, "river"), (text, "war"), (text, "the")]
    )
    assert [r["rank"] for r in results[:3]] == [1, 3, 8]
    # "the" is below every biased token; its place among the other 192 is the model's.
    assert 9 <= results[3]["rank"] <= 200
    assert [p["token"] for p in results[0]["predictions"]] == RANKED[:5]
    assert results[0]["predictions"][0]["score"] > 0.99
    # The true words king, river, war, the: each once, so the commonest-word baseline
    # guesses one of them for top 1 (1 of 4) and all four in its top 5.
    assert fillmask.summary(results, 5) == (
        "true word in top 1: 1/4 (25%), in top 5: 2/4 (50%); baseline (the commonest true "
        "words of these examples): top 1 1/4 (25%), top 5 4/4 (100%)"
    )
    assert "rank: >5 (rank 8 of 113 words)" in fillmask.format_example(3, results[2], 5)


def test_only_tokens_that_can_be_a_word_are_ranked(export_dir):
    # A model that puts "," or "##s" first has not guessed a word: neither is ranked, and the
    # ranks and the top 5 are over words only, as the masked word is chosen.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    words = fillmask.word_tokens(tokenizer)
    vocab = tokenizer.get_vocab()
    assert words[vocab["king"]] and words[vocab["the"]]
    unranked = [t for t in vocab if t in (",", ".", "[MASK]", "[CLS]") or t.startswith("##")]
    assert len(unranked) > 4 and not any(words[vocab[t]] for t in unranked)
    (result,) = fillmask.fill_mask_examples(export_dir, [("a [MASK] by the river", "city")])
    assert all(words[p["id"]] for p in result["predictions"])


def test_demo_on_shards_is_deterministic_in_the_seed(export_dir, small_shards, capsys):
    outputs = []
    for seed in ("0", "0", "1"):
        assert fillmask.main([str(export_dir), str(small_shards), "-n", "3", "--seed", seed]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] != outputs[2]
    lines = outputs[0].splitlines()
    assert [line.split(".")[0] for line in lines[::3][:3]] == ["1", "2", "3"]
    assert sum("[MASK]" in line for line in lines) == 3
    assert lines[-1].startswith("true word in top 1: ") and "/3 (" in lines[-1]
    assert "baseline (the commonest true words of these examples): top 1 " in lines[-1]
    assert fillmask.main([str(export_dir), str(small_shards), "-n", "4", "--show", "1"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert sum("[MASK]" in line for line in shown) == 1 and "... and 3 more" in shown[-2]
    assert "/4 (" in shown[-1]


def test_demo_on_text_and_its_errors(export_dir, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("The queen built a church.\n\n!!!\n", encoding="utf-8")
    assert fillmask.main([str(export_dir), str(tmp_path / "notes.txt"), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "1. The queen built a church." not in out and "[MASK]" in out  # one sentence only
    assert "/1 (" in out.splitlines()[-1]
    bare = tmp_path / "bare"
    BertForPreTraining(BertConfig.preset("tiny", vocab_size=200)).save_hf(bare)
    with pytest.raises(FileNotFoundError, match=r"python -m trainer\.export"):
        fillmask.fill_mask_examples(bare, [("a [MASK] .", "king")])
    assert fillmask.main([str(bare), str(tmp_path / "notes.txt")]) == 2
    assert fillmask.main([str(export_dir), str(tmp_path / "missing")]) == 2


def test_mlm_rows_give_each_documents_run_of_sentences(tmp_path):
    """MLM rows (no segments, no masks) give the runs of the documents they pack."""
    shards = build_shards(tmp_path / "mlm", n_docs=40, objective="mlm")
    sentences = fillmask.shard_sentences(str(shards), 60, random.Random(0))
    assert len(sentences) == 60 and all(sentences)
    assert not any("[MASK]" in s or "[CLS]" in s or "[SEP]" in s for s in sentences)
    vocab = read_shard_vocab(shards).tokens
    sep, cls = vocab.index("[SEP]"), vocab.index("[CLS]")
    row = {"input_ids": np.array([cls, 7, 8, sep, 9, sep]), "continues_word": np.zeros(6, bool)}
    assert fillmask.row_segments(row, vocab) == [vocab[7] + " " + vocab[8], vocab[9]]
