"""Streaming batches from real shards: padding, worker/rank partition, dynamic masking, errors."""

import shutil

import numpy as np
import pytest
import torch

from pipeline.shards.shard_format import ShardFormatError, open_shard, row_to_numpy
from trainer.data import DynamicMasker, PretrainingStream, StreamSpec, collate, make_loader
from trainer.shards import ShardSet


def stream(path, **spec) -> PretrainingStream:
    shards = ShardSet(str(path))
    shards.check()
    spec = {"micro": 8, "world_size": 1, "rank": 0, "seed": 5, "window": 100, **spec}
    masker = DynamicMasker(shards.manifest) if spec.get("masking") == "dynamic" else None
    return PretrainingStream(shards, StreamSpec(**spec), masker)


def test_collate_pads_to_a_multiple_of_8_and_max_predictions():
    rows = [
        (
            {
                "input_ids": np.array([2, 9, 4, 3, 7, 3], np.uint16),
                "segment_ids": np.array([0, 0, 0, 0, 1, 1], np.uint8),
                "masked_lm_positions": np.array([2], np.uint8),
                "masked_lm_ids": np.array([11], np.uint16),
            },
            1,
        ),
        (
            {
                "input_ids": np.arange(2, 13, dtype=np.uint16),
                "segment_ids": np.zeros(11, np.uint8),
                "masked_lm_positions": np.array([1, 5], np.uint8),
                "masked_lm_ids": np.array([8, 9], np.uint16),
            },
            0,
        ),
    ]
    batch = collate(rows, max_predictions=4, pad_id=0)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (2, 16),
        "segment_ids": (2, 16),
        "attention_mask": (2, 16),
        "masked_lm_positions": (2, 4),
        "masked_lm_ids": (2, 4),
        "next_sentence_label": (2,),
    }
    assert all(v.dtype == torch.int64 for v in batch.values())
    assert batch["input_ids"][0].tolist() == [2, 9, 4, 3, 7, 3] + [0] * 10
    assert batch["attention_mask"].sum(1).tolist() == [6, 11]
    assert batch["segment_ids"][0, :7].tolist() == [0, 0, 0, 0, 1, 1, 0]
    assert batch["masked_lm_positions"].tolist() == [[2, 0, 0, 0], [1, 5, 0, 0]]
    assert batch["masked_lm_ids"].tolist() == [[11, 0, 0, 0], [8, 9, 0, 0]]
    assert batch["next_sentence_label"].tolist() == [1, 0]
    assert collate(rows, max_predictions=4, max_width=12)["input_ids"].shape[1] == 12
    with pytest.raises(ValueError, match="max_predictions_per_seq 1"):
        collate(rows, max_predictions=1)


def good_row(**changes):
    row = {
        "input_ids": np.array([2, 9, 4, 3, 7, 3], np.uint16),
        "segment_ids": np.array([0, 0, 0, 0, 1, 1], np.uint8),
        "masked_lm_positions": np.array([2], np.uint8),
        "masked_lm_ids": np.array([11], np.uint16),
    }
    label = changes.pop("label", 0)
    return {**row, **{k: np.array(v) for k, v in changes.items()}}, label


@pytest.mark.parametrize(
    ("row", "match"),
    [
        (
            good_row(input_ids=[2, 9, 200, 3, 7, 3]),
            r"input_ids values must be in \[0, 200\), got 200 in row 1",
        ),
        (
            good_row(segment_ids=[0, 0, 2, 0, 1, 1]),
            r"segment_ids values must be in \[0, 2\), got 2 in row 1",
        ),
        (
            good_row(masked_lm_positions=[6]),
            r"masked_lm_positions values must be in \[0, 6 \(the row's length\)\), got 6",
        ),
        (
            good_row(masked_lm_ids=[250]),
            r"masked_lm_ids values must be in \[0, 200\), got 250 in row 1",
        ),
        (good_row(label=2), r"next_sentence_label values must be in \[0, 2\), got 2 in row 1"),
    ],
)
def test_collate_names_a_value_out_of_range(row, match):
    """The values the model no longer checks on the device (model/bert.py) are checked here."""
    with pytest.raises(ValueError, match=match):
        collate([good_row(), row], max_predictions=4, vocab_size=200)
    collate([good_row(), good_row()], max_predictions=4, vocab_size=200)


def test_a_changed_shard_is_named_with_the_validate_command(tiny_shards):
    s = stream(tiny_shards)
    s.vocab_size = 5  # as if the shards held ids the vocab does not
    with pytest.raises(
        ValueError,
        match=r"input_ids values must be in \[0, 5\).*shard-0000\d-of-00003\.arrow.*python -m pipeline validate",
    ):
        s.batch(0)


def test_a_bad_row_is_named_by_its_shard_and_row_not_the_whole_batch(tiny_shards):
    s = stream(tiny_shards)
    rows_of = s.shards.rows
    taken = []

    def one_bad_row(shard, row):  # the 4th row of the batch, as a shard changed on disk
        taken.append((shard.copy(), row.copy()))
        rows = rows_of(shard, row)
        columns, label = rows[3]
        rows[3] = ({**columns, "segment_ids": np.full_like(columns["segment_ids"], 255)}, label)
        return rows

    s.shards.rows = one_bad_row
    for k in range(100):  # a batch whose rows come from more than one shard
        with pytest.raises(ShardFormatError) as raised:
            s.batch(k)
        shard, row = taken[-1]
        if len(set(shard.tolist())) > 1:
            break
    bad = f"row {row[3]} of {s.shards.path(int(shard[3]))}"
    assert f"segment_ids values must be in [0, 2), got 255 in row 3 of the batch; {bad}:" in str(
        raised.value
    )
    others = {s.shards.path(int(i)) for i in shard} - {s.shards.path(int(shard[3]))}
    assert others and not any(name in str(raised.value) for name in others)


def test_batches_hold_the_shards_rows(tiny_shards):
    s = stream(tiny_shards)
    batch = s.batch(0)
    first = batch["row_ids"][0].item()
    shard = int(np.searchsorted(s.first_row_id, first, side="right")) - 1
    row = row_to_numpy(
        open_shard(str(tiny_shards / s.shards.names[shard])), first - s.first_row_id[shard]
    )
    n = len(row["input_ids"])
    assert batch["input_ids"][0, :n].tolist() == row["input_ids"].tolist()
    k = len(row["masked_lm_positions"])
    assert batch["masked_lm_ids"][0, :k].tolist() == row["masked_lm_ids"].tolist()
    assert batch["masked_lm_positions"].shape[1] == s.shards.params["max_predictions_per_seq"]
    assert batch["input_ids"].shape[1] % 8 == 0


def test_workers_do_not_change_the_batches(tiny_shards):
    def first(num_workers):
        loader = make_loader(stream(tiny_shards, rank=1, world_size=2), num_workers)
        return [b["row_ids"].tolist() for _, b in zip(range(20), loader, strict=False)]

    assert first(0) == first(2)


def test_two_ranks_with_two_workers_read_one_epoch_exactly_once(tiny_shards):
    n = ShardSet(str(tiny_shards)).num_rows
    per_rank = []
    for rank in range(2):
        loader = make_loader(stream(tiny_shards, rank=rank, world_size=2), 2)
        per_rank.append([b["row_ids"] for _, b in zip(range(n // 16 + 2), loader, strict=False)])
    stream_order = torch.cat([torch.cat(pair) for pair in zip(*per_rank, strict=True)]).tolist()
    assert sorted(stream_order[:n]) == list(range(n))  # an epoch: no row lost, none repeated
    assert len(set(stream_order[n:])) == len(stream_order) - n  # then the next epoch begins


def test_start_position_skips_ahead_exactly(tiny_shards):
    full = [
        stream(tiny_shards, rank=r, world_size=2).batch(k)["row_ids"]
        for k in range(5)
        for r in range(2)
    ]
    resumed = [
        stream(tiny_shards, rank=r, world_size=2, start=32).batch(k)["row_ids"]
        for k in range(3)
        for r in range(2)
    ]
    assert torch.equal(torch.cat(resumed), torch.cat(full[4:]))


def test_evaluation_pass_covers_every_row_once_with_inert_fillers(tiny_shards):
    n = ShardSet(str(tiny_shards)).num_rows
    ids, fillers = [], 0
    for rank in range(2):
        s = stream(tiny_shards, rank=rank, world_size=2, micro=64, finite=True)
        for batch in make_loader(s, 2):
            real = batch["row_ids"] >= 0
            ids += batch["row_ids"][real].tolist()
            fillers += int((~real).sum())
            assert (batch["masked_lm_positions"][~real] == 0).all()
            assert (batch["next_sentence_label"][~real] == -100).all()
    assert sorted(ids) == list(range(n)) and fillers == -n % 128


def test_dynamic_masking_follows_googles_rules(tiny_shards):
    static = stream(tiny_shards, micro=512)
    dynamic = stream(tiny_shards, micro=512, masking="dynamic")
    a, b = static.batch(0), dynamic.batch(0)
    assert torch.equal(a["row_ids"], b["row_ids"])

    def originals(batch):
        ids = batch["input_ids"].clone()
        ids.scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
        ids[:, 0] = batch["input_ids"][:, 0]  # position 0 is padding in the scatter, [CLS] here
        return ids

    assert torch.equal(originals(a), originals(b))  # same text, new masks
    targets = b["masked_lm_positions"] != 0
    assert not torch.equal(a["masked_lm_positions"], b["masked_lm_positions"])
    lengths = b["attention_mask"].sum(1)
    expected = torch.clamp(torch.round(lengths * 0.15), min=1).clamp(max=20)
    assert torch.equal(targets.sum(1), expected.long())  # round(0.15 n), n counting specials
    assert abs(targets.sum().item() / lengths.sum().item() - 0.15) < 0.01
    at = b["input_ids"].gather(1, b["masked_lm_positions"])[targets]
    truth = b["masked_lm_ids"][targets]
    mask_share = (at == 4).float().mean().item()
    kept_share = ((at == truth) & (truth != 4)).float().mean().item()
    assert 0.77 < mask_share < 0.83 and 0.07 < kept_share < 0.13
    cls_sep = torch.isin(b["masked_lm_ids"][targets], torch.tensor([2, 3]))
    assert not cls_sep.any()  # [CLS] and [SEP] are never predicted
    # Deterministic for a stream position; fresh masks in the next epoch.
    again = stream(tiny_shards, micro=512, masking="dynamic").batch(0)
    assert torch.equal(again["input_ids"], b["input_ids"])
    n = dynamic.order.num_rows
    next_epoch = stream(tiny_shards, micro=512, masking="dynamic", start=n, window=10**9)
    first_epoch = stream(tiny_shards, micro=512, masking="dynamic", window=10**9)
    assert not torch.equal(next_epoch.batch(0)["input_ids"], first_epoch.batch(0)["input_ids"])


def test_truncated_shard_is_named_or_skipped_and_counted(tiny_shards, tmp_path):
    broken = tmp_path / "shards"
    shutil.copytree(tiny_shards, broken)
    victim = broken / "shard-00001-of-00003.arrow"
    victim.write_bytes(victim.read_bytes()[:-100])
    with pytest.raises(ShardFormatError, match=r"shard-00001-of-00003\.arrow"):
        ShardSet(str(broken)).check()
    shards = ShardSet(str(broken))
    assert shards.check(skip_corrupt=True) == ["shard-00001-of-00003.arrow"]
    rows = [e["rows"] for e in shards.manifest["shards"]]
    assert shards.num_rows == rows[0] + rows[2]
    s = PretrainingStream(shards, StreamSpec(micro=shards.num_rows, world_size=1, rank=0, seed=1))
    ids = s.batch(0)["row_ids"]
    assert sorted(ids.tolist()) == list(range(rows[0])) + list(range(rows[0] + rows[1], sum(rows)))


def test_rows_are_views_into_the_memory_map(tiny_shards):
    shards = ShardSet(str(tiny_shards))
    ((row, _),) = shards.rows([0], [3])
    assert not row["input_ids"].flags.owndata and not row["input_ids"].flags.writeable


def test_a_uri_reads_like_a_local_path(tiny_shards):
    """gs:// and s3:// go through pyarrow.fs like file:// (no credentials needed here)."""
    local = stream(tiny_shards).batch(3)
    remote = stream(f"file://{tiny_shards}").batch(3)
    assert all(torch.equal(local[k], remote[k]) for k in local)
