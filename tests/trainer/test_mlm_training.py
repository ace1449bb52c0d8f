"""MLM-only training: shards without next_sentence_label, masking at --mask-rate, evaluation at
one fixed rate, and the NSP loss left out (trainer/data.py, trainer/evaluate.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import BertConfig, BertForPreTraining
from pipeline.core.masking import MaskingConfig, MaskingVocab, mask_instances
from pipeline.core.rng import numpy_rng
from pipeline.shards import shard_format
from report.summary import MARGIN, summary_lines
from tests.helpers import TINY, args, build_shards, launch, max_weight_difference, records
from trainer.config import parse_args
from trainer.data import PretrainingStream, StreamSpec
from trainer.masking import (
    DynamicMasker,
    MaskOptions,
    default_whole_word,
    eval_masker_for,
    masker_for,
)
from trainer.metrics import eval_line, progress_line
from trainer.run import main
from trainer.shards import NSP_IGNORE, ShardSet


def _tiny_batch(b: int = 6, t: int = 12, labels: torch.Tensor | None = None) -> dict:
    gen = torch.Generator().manual_seed(0)
    positions = torch.tensor([[1, 3, 0]] * b)
    return {
        "input_ids": torch.randint(5, TINY["vocab_size"], (b, t), generator=gen),
        "segment_ids": torch.zeros(b, t, dtype=torch.long),
        "attention_mask": torch.ones(b, t, dtype=torch.long),
        "masked_lm_positions": positions,
        "masked_lm_ids": torch.randint(5, TINY["vocab_size"], (b, 3), generator=gen),
        "next_sentence_label": labels if labels is not None else torch.full((b,), -100),
    }


def test_all_ignored_nsp_labels_give_no_nsp_loss_and_no_nan():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    out = model(**_tiny_batch())
    assert out.nsp_loss.item() == 0.0 and torch.isfinite(out.loss)
    assert torch.equal(out.loss, out.mlm_loss)
    out.loss.backward()
    assert model.cls.seq_relationship.weight.grad.abs().max() == 0  # the NSP head learns nothing


def test_labelled_nsp_loss_is_torch_mean_bitwise():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    labels = torch.tensor([0, 1, 1, 0, 1, 1])
    out = model(**_tiny_batch(labels=labels))
    assert torch.equal(out.nsp_loss, F.cross_entropy(out.nsp_logits.float(), labels))
    half = torch.tensor([0, -100, 1, -100, 1, -100])  # the mean over the labelled rows only
    out = model(**_tiny_batch(labels=half))
    keep = half >= 0
    expected = F.cross_entropy(out.nsp_logits.float()[keep], half[keep])
    assert torch.allclose(out.nsp_loss, expected, atol=1e-6)


# ----------------------------------------------------------------------------- fixtures

MICRO = 8
SEQ = 48  # build_shards' max_seq_length


@pytest.fixture(scope="module")
def mlm_shards(tmp_path_factory) -> Path:
    """Unmasked MLM rows (kind mlm): 382 rows of seq <= 48, vocab 200, 14% of tokens ## pieces."""
    return build_shards(tmp_path_factory.mktemp("mlm"), objective="mlm", dupe_factor=1)


@pytest.fixture(scope="module")
def mlm_eval_shards(tmp_path_factory, mlm_shards) -> Path:
    """139 MLM rows with the vocab of mlm_shards (the first 40 of its 120 documents: an
    evaluation set, not a held-out one)."""
    tmp = tmp_path_factory.mktemp("mlm_eval")
    vocab = str(mlm_shards / "vocab.txt")
    return build_shards(tmp, n_docs=40, objective="mlm", dupe_factor=1, vocab_file=vocab)


def mlm_stream(path, options=None, **spec) -> PretrainingStream:
    shards = ShardSet(str(path))
    shards.check()
    spec = {"micro": MICRO, "world_size": 1, "rank": 0, "seed": 5, "window": 100, **spec}
    return PretrainingStream(
        shards, StreamSpec(**spec), DynamicMasker(shards.manifest, None, options)
    )


def train_config(*flags: str):
    """A TrainConfig of these flags (and placeholder paths, never read)."""
    return parse_args(
        ["--ds-config", "x", "--data", "y", "--output-dir", "z", "--model", "tiny", *flags]
    )


def epoch(stream: PretrainingStream) -> list[dict]:
    """The batches of about one epoch (the stream's rows / micro)."""
    return [stream.batch(k) for k in range(stream.shards.num_rows // stream.spec.micro)]


def masked_share(batches: list[dict]) -> float:
    """Masked positions / tokens of the rows, [CLS] and [SEP] counted (as Google's rate)."""
    masked = sum(int((b["masked_lm_positions"] != 0).sum()) for b in batches)
    return masked / sum(int(b["attention_mask"].sum()) for b in batches)


def words_of(continues: np.ndarray) -> np.ndarray:
    """int (n,): the word number of each token; a continuing token has its predecessor's."""
    return np.cumsum(~continues)


def split_words(batches: list[dict], flags: list[np.ndarray]) -> int:
    """Masked words of which only a part is masked, over the batches' rows."""
    split, i = 0, 0
    for b in batches:
        for positions in b["masked_lm_positions"]:
            words = words_of(flags[i])
            chosen = np.zeros(len(words), dtype=bool)
            chosen[positions[positions != 0].numpy()] = True
            split += sum(not chosen[words == w].all() for w in np.unique(words[chosen]))
            i += 1
    return split


def row_flags(stream: PretrainingStream, batches: list[dict]) -> list[np.ndarray]:
    """continues_word of each row of the batches, in order."""
    ids = torch.cat([b["row_ids"] for b in batches]).numpy()
    starts = stream.first_row_id
    shard = np.searchsorted(starts, ids, side="right") - 1
    return [row["continues_word"] for row, _ in stream.shards.rows(shard, ids - starts[shard])]


# ----------------------------------------------------------------------------- reading MLM rows


def test_mlm_rows_batch_with_segment_ids_0_and_no_nsp_label(mlm_shards):
    stream = mlm_stream(mlm_shards)
    assert stream.shards.kind == "mlm" and not stream.shards.trains_nsp
    batch = stream.batch(0)
    assert (batch["segment_ids"] == 0).all()
    assert (batch["next_sentence_label"] == NSP_IGNORE).all()
    # Unmasked ids come back where nothing is masked; continues_word as the format has it.
    ids = batch["row_ids"].numpy()
    table_rows = []
    for name in stream.shards.names:
        table_rows += list(shard_format.iter_rows(shard_format.open_shard(mlm_shards / name)))
    for r, row_id in enumerate(ids.tolist()):
        original = table_rows[row_id]["input_ids"]
        n = len(original)
        got = batch["input_ids"][r, :n].clone()
        positions = batch["masked_lm_positions"][r]
        got[positions[positions != 0]] = batch["masked_lm_ids"][r][positions != 0]
        assert got.tolist() == original.tolist()
    flags = row_flags(stream, [batch])
    assert [f.tolist() for f in flags] == [table_rows[i]["continues_word"].tolist() for i in ids]


def test_unmasked_mlm_rows_need_a_masker(mlm_shards):
    shards = ShardSet(str(mlm_shards))
    with pytest.raises(ValueError, match="unmasked MLM rows need a masker"):
        PretrainingStream(shards, StreamSpec(micro=8, world_size=1, rank=0, seed=0))


def test_statically_masked_mlm_rows_train_from_their_masks_or_are_re_masked(tmp_path):
    built = build_shards(
        tmp_path, objective="mlm", static_masks="true", masked_lm_prob=0.3, dupe_factor=1
    )
    shards = ShardSet(str(built))
    assert shards.kind == "mlm_masked"
    static = PretrainingStream(shards, StreamSpec(micro=8, world_size=1, rank=0, seed=5))
    assert static.max_predictions == shards.params["max_predictions_per_seq"] == 15
    batch = static.batch(0)
    assert (batch["segment_ids"] == 0).all() and (batch["next_sentence_label"] == -100).all()
    rows = shards.rows(*static.order.locate(np.arange(8))[1:])
    for r, (row, _) in enumerate(rows):  # the shards' own masks, as stored
        k = len(row["masked_lm_positions"])
        assert batch["masked_lm_positions"][r, :k].tolist() == row["masked_lm_positions"].tolist()
    spec = StreamSpec(micro=8, world_size=1, rank=0, seed=5, masking="dynamic")
    masker = DynamicMasker(shards.manifest, None, MaskOptions(rate=0.15))
    again = PretrainingStream(shards, spec, masker).batch(0)
    assert again["masked_lm_ids"].shape[1] == 8  # ceil(0.15 * 48)
    for r, (row, _) in enumerate(rows):  # re-masked from the original ids
        ids = again["input_ids"][r, : len(row["input_ids"])].clone()
        positions = again["masked_lm_positions"][r]
        ids[positions[positions != 0]] = again["masked_lm_ids"][r][positions != 0]
        original = row["input_ids"].astype(np.int64)
        original[row["masked_lm_positions"].astype(np.int64)] = row["masked_lm_ids"]
        assert ids.tolist() == original.tolist()


# ----------------------------------------------------------------------------- the rate


@pytest.mark.parametrize("rate", [0.15, 0.3])
def test_realised_masked_share_is_the_rate(mlm_shards, rate):
    stream = mlm_stream(mlm_shards, MaskOptions(rate=rate))
    batches = epoch(stream)
    # P follows the rate and no row reaches it: round(48 * rate) < ceil(48 * rate).
    assert stream.max_predictions == math.ceil(rate * SEQ) == batches[0]["masked_lm_ids"].shape[1]
    counts = torch.cat([(b["masked_lm_positions"] != 0).sum(1) for b in batches])
    assert counts.max() <= round(rate * SEQ) < stream.max_predictions
    # Each row gets round(n * rate) of its n tokens: over ~14,000 tokens the share is the
    # rate within 0.005 (measured: 0.1493 at 0.15 and 0.3003 at 0.3, 13,818 tokens).
    assert abs(masked_share(batches) - rate) < 0.005


def test_mask_split_sets_mask_keep_and_random_shares(mlm_shards):
    split = (0.5, 0.25, 0.25)
    batches = epoch(mlm_stream(mlm_shards, MaskOptions(rate=0.3, split=split)))
    mask_id = ShardSet(str(mlm_shards)).manifest["vocab"]["special_ids"]["mask"]
    chosen, targets = [], []
    for b in batches:
        real = b["masked_lm_positions"] != 0
        chosen.append(b["input_ids"].gather(1, b["masked_lm_positions"])[real])
        targets.append(b["masked_lm_ids"][real])
    chosen, targets = torch.cat(chosen), torch.cat(targets)
    as_mask = (chosen == mask_id).float().mean().item()
    kept = ((chosen == targets) & (chosen != mask_id)).float().mean().item()
    # About 4,200 predictions: sd of a share <= 0.008; a random id is the original 0.5%.
    assert abs(as_mask - 0.5) < 0.035 and abs(kept - 0.25) < 0.035, (as_mask, kept)


def test_whole_word_masking_keeps_continues_word_groups_together(mlm_shards):
    whole = mlm_stream(mlm_shards, MaskOptions(rate=0.3, whole_word=True))
    batches = epoch(whole)
    assert split_words(batches, row_flags(whole, batches)) == 0
    assert abs(masked_share(batches) - 0.3) < 0.02  # a word that would overshoot is skipped
    tokens = mlm_stream(mlm_shards, MaskOptions(rate=0.3, whole_word=False))
    plain = epoch(tokens)
    assert split_words(plain, row_flags(tokens, plain)) > 20  # 543 here: the check can fail


def test_chinese_words_of_the_segmenter_are_masked_whole(tmp_path):
    pytest.importorskip("jieba", reason="pip install 'bert-pipeline[cjk]'")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = ["北京大学", "研究", "语言", "模型", "我们", "喜欢", "中国", "历史", "学生", "城市"]
    rng = np.random.default_rng(0)
    docs = []
    for _ in range(60):
        sentences = ["".join(rng.choice(words, size=6)) + "。" for _ in range(4)]
        docs.append("\n".join(sentences) + "\n\n")
    (corpus / "zh.txt").write_text("".join(docs), encoding="utf-8")
    from pipeline.cli.main import main as pipeline_main

    out = tmp_path / "shards"
    argv = ["build", "--input", str(corpus / "*.txt"), "--output", str(out), "--objective"]
    argv += ["mlm", "--wwm_segmenter", "jieba", "--vocab_size", "120", "--max_seq_length", "48"]
    assert pipeline_main(argv) == 0
    shards = ShardSet(str(out))
    assert default_whole_word(shards.manifest)  # built with a segmenter: whole words by default
    stream = mlm_stream(out, MaskOptions(rate=0.3))
    batches = epoch(stream)
    flags = row_flags(stream, batches)
    assert np.concatenate(flags).mean() > 0.3  # most characters continue a word
    assert split_words(batches, flags) == 0
    tokens = mlm_stream(out, MaskOptions(rate=0.3, whole_word=False))
    plain = epoch(tokens)
    assert split_words(plain, row_flags(tokens, plain)) > 20


# ----------------------------------------------------------------------------- determinism


def test_masks_follow_the_stream_position(mlm_shards):
    """What makes a resumed run's masks the uninterrupted run's: a batch's masks depend on
    its stream position alone (the resume test below checks the weights)."""
    options = MaskOptions(rate=0.3, whole_word=True)
    first = mlm_stream(mlm_shards, options)
    resumed = mlm_stream(mlm_shards, options, start=3 * MICRO)
    for k in range(3):
        a, b = first.batch(k + 3), resumed.batch(k)
        assert all(torch.equal(a[key], b[key]) for key in a)
    other_seed = mlm_stream(mlm_shards, options, seed=6).batch(0)
    assert not torch.equal(other_seed["masked_lm_positions"], first.batch(0)["masked_lm_positions"])


def test_nsp_dynamic_masking_without_mask_rate_is_todays(small_shards):
    """--masking dynamic on NSP shards without --mask-rate: the manifest's rate and cap,
    exactly the masks the trainer drew before --mask-rate (the old code path, inlined)."""
    shards = ShardSet(str(small_shards))
    params = shards.params
    masker = DynamicMasker(shards.manifest)
    assert masker.config == MaskingConfig(
        masked_lm_prob=params["masked_lm_prob"],
        max_predictions_per_seq=params["max_predictions_per_seq"],
    )
    spec = StreamSpec(micro=8, world_size=1, rank=0, seed=5, masking="dynamic")
    stream = PretrainingStream(shards, spec, masker)
    rows = shards.rows(*stream.order.locate(np.arange(8))[1:])
    originals = []
    for row, _ in rows:
        ids = row["input_ids"].astype(np.int32)
        ids[row["masked_lm_positions"].astype(np.int64)] = row["masked_lm_ids"]
        originals.append(ids)
    special = shards.manifest["vocab"]["special_ids"]
    vocab = MaskingVocab(special["cls"], special["sep"], special["mask"], 200)
    old = mask_instances(originals, masker.config, vocab, numpy_rng(5, "dynamic", 0, 8))
    batch = stream.batch(0)
    for r, masked in enumerate(old):
        k = len(masked.masked_lm_positions)
        assert batch["masked_lm_positions"][r, :k].tolist() == masked.masked_lm_positions.tolist()
        n = len(masked.input_ids)
        assert batch["input_ids"][r, :n].tolist() == masked.input_ids.tolist()
        assert batch["segment_ids"][r, :n].tolist() == rows[r][0]["segment_ids"].tolist()
    assert batch["next_sentence_label"].tolist() == [label for _, label in rows]


def test_nsp_dynamic_masking_at_mask_rate(small_shards):
    shards = ShardSet(str(small_shards))
    spec = StreamSpec(micro=8, world_size=1, rank=0, seed=5, masking="dynamic")
    stream = PretrainingStream(shards, spec, DynamicMasker(shards.manifest, None, MaskOptions(0.3)))
    assert stream.max_predictions == 15  # ceil(0.3 * 48), not the manifest's 8
    batches = epoch(stream)
    assert abs(masked_share(batches) - 0.3) < 0.01
    assert all(set(b["next_sentence_label"].tolist()) <= {0, 1} for b in batches)


def test_whole_word_masking_of_nsp_rows_groups_word_pieces(small_shards):
    config = train_config("--masking", "dynamic", "--mask-rate", "0.3", "--whole-word-mask", "true")
    shards = ShardSet(str(small_shards))
    masker = masker_for(shards, config)  # reads vocab.txt for its "##" pieces
    assert masker.config.do_whole_word_mask and masker.vocab.is_continuation.any()
    stream = PretrainingStream(shards, StreamSpec(micro=8, world_size=1, rank=0, seed=5), masker)
    batches = epoch(stream)
    pieces = masker.vocab.is_continuation
    special = shards.manifest["vocab"]["special_ids"]
    flags = []
    for b in batches:  # a row's "##" pieces from its original ids
        for r in range(len(b["input_ids"])):
            ids = b["input_ids"][r].clone()
            positions = b["masked_lm_positions"][r]
            ids[positions[positions != 0]] = b["masked_lm_ids"][r][positions != 0]
            ids = ids[: int(b["attention_mask"][r].sum())].numpy()
            after_special = np.isin(np.roll(ids, 1), [special["cls"], special["sep"]])
            # Google's quirk: a piece right after the middle [SEP] joins A's last word, across
            # the [SEP]; counted here as a word of its own, which the check still holds for.
            flags.append(pieces[ids] & ~after_special)
    assert np.concatenate(flags).any() and split_words(batches, flags) == 0


# ----------------------------------------------------------------------------- evaluation masks


def eval_masks(path, config, *, micro: int, world_size: int) -> dict[int, tuple]:
    """{row id: (masked positions, input ids)} over one evaluation pass of every rank."""
    shards = ShardSet(str(path))
    masker = eval_masker_for(shards, config)
    out = {}
    for rank in range(world_size):
        spec = StreamSpec(
            micro=micro, world_size=world_size, rank=rank, seed=config.seed, finite=True
        )
        stream = PretrainingStream(shards, spec, masker)
        for k in range(stream.num_batches()):
            b = stream.batch(k)
            for r, row_id in enumerate(b["row_ids"].tolist()):
                if row_id >= 0:
                    positions = b["masked_lm_positions"][r]
                    n = int(b["attention_mask"][r].sum())  # the padded width is the batch's
                    ids = b["input_ids"][r, :n].tolist()
                    out[row_id] = (positions[positions != 0].tolist(), ids)
    return out


def test_evaluation_masks_are_the_same_whatever_the_run(mlm_eval_shards):
    config = train_config
    a = eval_masks(mlm_eval_shards, config("--mask-rate", "0.3"), micro=8, world_size=1)
    b = eval_masks(
        mlm_eval_shards,
        config("--mask-rate", "0.15", "--seed", "7", "--whole-word-mask", "true"),
        micro=5,
        world_size=2,
    )
    assert len(a) == ShardSet(str(mlm_eval_shards)).num_rows and a == b
    masked = sum(len(p) for p, _ in a.values())
    tokens = sum(len(ids) for _, ids in a.values())
    assert abs(masked / tokens - 0.15) < 0.01  # --eval-mask-rate's default
    c = eval_masks(mlm_eval_shards, config("--eval-mask-rate", "0.3"), micro=8, world_size=1)
    assert c != a


def test_nsp_held_out_rows_keep_their_static_masks(small_shards):
    config = train_config()
    assert eval_masker_for(ShardSet(str(small_shards)), config) is None


# ----------------------------------------------------------------------------- console lines


def test_lines_say_nsp_was_not_trained():
    record = {"step": 5, "mlm_accuracy": 0.3, "mlm_baseline_accuracy": 0.05, "objective": "mlm"}
    record.update(nsp_accuracy=None, nsp_baseline_accuracy=None, loss=4.0)
    assert "NSP not trained" in progress_line(record, 10, 1.0)
    line = eval_line({**record, "eval_mask_rate": 0.15, "mlm_loss": 4.0})
    assert line.startswith("eval at step 5 (masked at 15%): MLM acc 0.300 (most-frequent-token")
    assert "NSP not trained" in line and "NSP acc" not in line
    nsp = {**record, "objective": "mlm+nsp", "nsp_accuracy": 0.7, "nsp_baseline_accuracy": 0.6}
    assert "NSP acc 0.700 (majority 0.600)" in eval_line(nsp)


# ----------------------------------------------------------------------------- training runs

# Constant after 5 warm-up steps: a run stopped and resumed follows the same rates (a decay
# over --max-steps would be another schedule for the first leg).
CONSTANT_LR = {
    "optimizer": {"type": "AdamW", "params": {"lr": 5e-3, "torch_adam": True}},
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_num_steps": 5, "warmup_max_lr": 5e-3, "warmup_type": "linear"},
    },
}


def run_argv(tmp: Path, data: Path, out: str, *extra: str, **ds) -> list[str]:
    argv = args(tmp, data, "--export-hf", "false", "--dropout", "0", *extra, **ds)
    argv[argv.index("--output-dir") + 1] = str(tmp / out)
    return argv


@pytest.fixture(scope="module")
def learned_run(tmp_path_factory, mlm_shards, mlm_eval_shards) -> Path:
    """150 steps of 16 rows of TINY at --mask-rate 0.3 on MLM rows (about 6 epochs),
    evaluated at steps 75 and 150."""
    tmp = tmp_path_factory.mktemp("mlm_run")
    extra = ["--max-steps", "150", "--log-every", "10", "--save-every", "0", "--mask-rate", "0.3"]
    extra += ["--eval-data", str(mlm_eval_shards), "--eval-every", "75"]
    ds = {**CONSTANT_LR, "train_micro_batch_size_per_gpu": 16}
    assert main(run_argv(tmp, mlm_shards, "out", *extra, **ds)) == 0
    return tmp / "out"


def test_mlm_only_run_learns_beyond_the_baseline(learned_run, mlm_eval_shards):
    train = records(learned_run)
    assert all(r["objective"] == "mlm" and r["nsp_accuracy"] is None for r in train)
    assert all(r["loss"] == r["mlm_loss"] for r in train)  # no NSP term
    assert train[-1]["mlm_loss"] < train[0]["mlm_loss"] - 0.5
    last = records(learned_run, "eval")[-1]
    assert last["eval_mask_rate"] == 0.15
    assert last["rows"] == ShardSet(str(mlm_eval_shards)).num_rows
    assert last["nsp_accuracy"] is None and last["nsp_baseline_accuracy"] is None
    # Past the unigram plateau: an evaluation loss below the entropy of the targets, an
    # accuracy the summary's MARGIN above always guessing the commonest target (measured at
    # step 150: loss 4.141 against 4.277, accuracy 0.103 against 0.026; at step 75 still on
    # the plateau, 4.304 and 0.034).
    assert last["mlm_loss"] < last["mlm_unigram_loss"] - 0.05, last
    assert last["mlm_accuracy"] > last["mlm_baseline_accuracy"] + MARGIN, last


def test_evaluations_mask_the_same_positions_every_time(
    learned_run, tmp_path, mlm_shards, mlm_eval_shards
):
    """Two evaluations of one run, and one of a run at another --mask-rate, batch and seed:
    the held-out targets (their histogram gives the baseline and the unigram loss) are one."""
    first, second = records(learned_run, "eval")
    extra = ["--max-steps", "2", "--save-every", "0", "--seed", "3", "--mask-rate", "0.2"]
    extra += ["--eval-data", str(mlm_eval_shards)]
    assert (
        main(run_argv(tmp_path, mlm_shards, "other", *extra, train_micro_batch_size_per_gpu=4)) == 0
    )
    other = records(tmp_path / "other", "eval")[-1]
    for key in ("mlm_baseline_accuracy", "mlm_unigram_loss", "rows"):
        assert first[key] == second[key] == other[key], key


def test_summary_says_nsp_was_not_trained(learned_run):
    lines = summary_lines(records(learned_run) + records(learned_run, "eval"))
    text = "\n".join(lines)
    assert lines[-1].startswith("OK: the model learned")  # MLM alone: no NSP to miss
    assert "NSP was not trained" in text and "masked at 15%" in text
    assert "NSP accuracy 0" not in text and "majority-class" not in text
    assert "MLM accuracy" in text and "most-frequent-token baseline" in text


def test_a_resumed_mlm_run_ends_as_the_uninterrupted_one(tmp_path, mlm_shards):
    extra = ["--mask-rate", "0.2", "--whole-word-mask", "true", "--log-every", "3"]
    straight = run_argv(tmp_path, mlm_shards, "straight", "--max-steps", "6", *extra, **CONSTANT_LR)
    assert main([*straight, "--save-every", "6"]) == 0
    first = run_argv(tmp_path, mlm_shards, "resumed", "--max-steps", "3", *extra, **CONSTANT_LR)
    assert main([*first, "--save-every", "3"]) == 0
    again = run_argv(tmp_path, mlm_shards, "resumed", "--max-steps", "6", *extra, **CONSTANT_LR)
    assert main([*again, "--save-every", "3", "--resume", "auto"]) == 0
    tag = "step00000006"
    assert max_weight_difference(tmp_path / "straight", tmp_path / "resumed", tag) == 0.0
    losses = [r["loss"] for r in records(tmp_path / "straight")]
    assert losses == [r["loss"] for r in records(tmp_path / "resumed")]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--mask-rate", "0.7"], "--mask-rate must be in [0.05, 0.5], got 0.7"),
        (["--mask-rate", "0.01"], "--mask-rate must be in [0.05, 0.5], got 0.01"),
        (["--eval-mask-rate", "0.6"], "--eval-mask-rate must be in [0.05, 0.5]"),
        (["--mask-split", "0.8,0.1"], "--mask-split must be three shares"),
    ],
)
def test_bad_masking_flags_exit_2_naming_the_flag(tmp_path, mlm_shards, caplog, flags, said):
    assert main(run_argv(tmp_path, mlm_shards, "out", "--max-steps", "1", *flags)) == 2
    assert said in caplog.text


def test_mask_rate_on_static_masks_asks_for_dynamic_masking(tmp_path, small_shards, caplog):
    argv = run_argv(tmp_path, small_shards, "out", "--max-steps", "1", "--mask-rate", "0.3")
    assert main(argv) == 2
    assert "--mask-rate shape dynamic masks" in caplog.text and "--masking dynamic" in caplog.text


@pytest.mark.slow
def test_a_killed_two_rank_mlm_run_resumes_to_the_same_weights(zero2_files, mlm_shards):
    """SIGKILL of rank 1 after step 6 of 8 (checkpoint at 4), then --resume auto: the weights
    of the uninterrupted run (two ranks, ZeRO-2, dynamic whole-word masks at 0.3)."""
    masks = ("--mask-rate", "0.3", "--whole-word-mask", "true")
    run = {"steps": 8, "save_every": 4}
    straight = launch(zero2_files, mlm_shards, zero2_files / "mlm-straight", *masks, **run)
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = zero2_files / "mlm-killed"
    killed = launch(zero2_files, mlm_shards, out, *masks, fault="sigkill@6:1", **run)
    assert killed.returncode in (1, 247), killed.stderr[-3000:]  # as in test_resume.py
    resumed = launch(zero2_files, mlm_shards, out, *masks, "--resume", "auto", **run)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    difference = max_weight_difference(zero2_files / "mlm-straight", out, "step00000008")
    assert difference <= 1e-6  # test_resume.py's bound for two ZeRO-2 ranks


def test_a_row_kind_the_trainer_does_not_know_is_refused(tmp_path, mlm_shards, caplog):
    import json
    import shutil

    shards = tmp_path / "future"
    shutil.copytree(mlm_shards, shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["schema"]["kind"] = "future"
    (shards / "manifest.json").write_text(json.dumps(manifest))
    assert main(run_argv(tmp_path, shards, "out", "--max-steps", "1")) == 2
    assert "row kind 'future' is unknown to this reader" in caplog.text
