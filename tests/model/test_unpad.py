"""The unpadded encoder (model/unpad.py) against the padded one: same outputs, same gradients."""

import copy

import pytest
import torch

from model import (
    BertConfig,
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
    HeadConfig,
    unpad,
)
from model.unpad import Packing, attention_path, bucket_rows
from tests.torch_helpers import CountHostSyncs

CFG = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=128,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def varied_batch(lengths, width, seed=0, predictions=5, left_padded=False):
    """Rows of the given real lengths, both segments, masked positions inside each row."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    input_ids = torch.randint(5, CFG.vocab_size, (b, width), generator=g)
    segment_ids = torch.zeros(b, width, dtype=torch.long)
    mask = torch.zeros(b, width, dtype=torch.long)
    positions = torch.zeros(b, predictions, dtype=torch.long)
    for i, n in enumerate(lengths):
        start = width - n if left_padded else 0
        mask[i, start : start + n] = 1
        segment_ids[i, start + n // 2 : start + n] = 1  # segment B: the second half
        k = min(predictions, n - 1)
        if k > 0:
            chosen = torch.randperm(n - 1, generator=g)[:k] + 1 + start
            positions[i, :k] = chosen.sort().values
    input_ids[mask == 0] = 0
    ids = torch.randint(5, CFG.vocab_size, (b, predictions), generator=g)
    nsp = torch.randint(0, 2, (b,), generator=g)
    return input_ids, segment_ids, mask, positions, ids, nsp


def pair(cls=BertForPreTraining, **kwargs):
    torch.manual_seed(0)
    padded = cls(**kwargs) if kwargs else cls(CFG)
    unpadded = copy.deepcopy(padded)
    padded.bert.unpad = False
    unpadded.bert.unpad = True
    return padded, unpadded


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def assert_grads_close(a, b, tol=1e-4):
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        if pb.grad is None:
            assert pa.grad is None, name
            continue
        if name.endswith("attention.self.key.bias"):
            # Zero in exact arithmetic (softmax ignores a shift shared by a query's
            # scores): both sides hold rounding noise.
            assert pa.grad.abs().max() < 1e-9 and pb.grad.abs().max() < 1e-9, name
            continue
        assert rel(pa.grad, pb.grad) < tol, name


LENGTHS = [128, 3, 1, 64, 127, 2, 90, 17]


@pytest.mark.parametrize("path", ["padded", "nested"])
def test_outputs_and_gradients_match_the_padded_encoder(path):
    padded, unpadded = pair()
    unpadded.set_unpadded(True, attention_path=path)
    ii, ss, am, pos, ids, nsp = varied_batch(LENGTHS, 128)
    ref = padded(ii, ss, am, pos, ids, nsp)
    out = unpadded(ii, ss, am, pos, ids, nsp)
    keep = am.bool()
    assert rel(out.sequence_output[keep], ref.sequence_output[keep]) < 1e-5
    assert out.sequence_output[~keep].abs().max() == 0  # padding is not computed
    for name in ("pooled_output", "nsp_logits", "loss", "mlm_loss", "nsp_loss"):
        assert rel(getattr(out, name), getattr(ref, name)) < 1e-5, name
    real = pos != 0
    assert rel(out.mlm_logits[real], ref.mlm_logits[real]) < 1e-5
    # The MLM head ran on the real predictions only, in row-major slot order.
    assert out.prediction_logits.shape == (int(real.sum()), CFG.vocab_size)
    assert out.prediction_index.tolist() == real.flatten().nonzero().squeeze(1).tolist()
    assert out.mlm_logits[~real].abs().max() == 0
    assert torch.equal(out.prediction_targets(pos, ids), ids[real])
    ref_targets = ref.prediction_targets(pos, ids)
    assert ref.prediction_logits.shape[0] == pos.numel()
    assert torch.equal(ref_targets[ref_targets != -100], ids[real])
    ref.loss.backward()
    out.loss.backward()
    assert_grads_close(unpadded, padded)


def test_rows_need_not_be_right_padded():
    padded, unpadded = pair()
    batch = varied_batch([5, 30, 12], 32, seed=3, left_padded=True)
    ref, out = padded(*batch), unpadded(*batch)
    keep = batch[2].bool()
    assert rel(out.sequence_output[keep], ref.sequence_output[keep]) < 1e-5
    # The pooler reads each row's first real token; the padded model reads position 0.
    first = keep.float().argmax(1)
    assert first.tolist() == [27, 2, 20]
    cls_hidden = ref.sequence_output[torch.arange(3), first]
    assert rel(out.pooled_output, torch.tanh(padded.bert.pooler.dense(cls_hidden))) < 1e-5
    assert rel(out.mlm_logits[batch[3] != 0], ref.mlm_logits[batch[3] != 0]) < 1e-5


def test_dense_batches_and_empty_rows_take_the_padded_path():
    padded, unpadded = pair()
    dense = varied_batch([16, 16], 16)
    hidden, packing = unpadded.bert.encode(*dense[:3])
    assert packing is None and hidden.shape == (2, 16, CFG.hidden_size)
    with_empty = varied_batch([16, 0, 5], 16)
    hidden, packing = unpadded.bert.encode(*with_empty[:3])
    assert packing is None
    out, ref = unpadded(*with_empty), padded(*with_empty)
    assert torch.isfinite(out.loss)
    assert rel(out.loss, ref.loss) < 1e-5
    _, packing = unpadded.bert.encode(*varied_batch([16, 3], 16)[:3])
    assert packing is not None and packing.num_tokens == 19
    nearly_dense = varied_batch([16, 15], 16)  # 97% real tokens: still unpadded
    assert unpadded.bert.encode(*nearly_dense[:3])[1] is not None


def test_every_batch_runs_a_dense_batch_unpadded_with_the_same_results():
    """set_unpadded(every_batch=True), as the trainer sets it: a batch without padding takes
    the unpadded path too (one path for every batch, which ZeRO's ranks need); a row with
    no real token still takes the padded one."""
    padded, unpadded = pair()
    unpadded.set_unpadded(True, every_batch=True)
    dense = varied_batch([16, 16], 16)
    hidden, packing = unpadded.bert.encode(*dense[:3])
    assert packing is not None and packing.num_tokens == 32 and hidden.shape == (32, 32)
    out, ref = unpadded(*dense), padded(*dense)
    out.loss.backward()
    ref.loss.backward()
    assert rel(out.loss, ref.loss) < 1e-5
    assert_grads_close(unpadded, padded)
    assert unpadded.bert.encode(*varied_batch([16, 0, 5], 16)[:3])[1] is None
    unpadded.set_unpadded(True)
    assert unpadded.bert.encode(*dense[:3])[1] is None  # the default: padded when dense


@pytest.mark.slow  # compiles the model (inductor): about half a minute on 2 cores
def test_compiled_backward_hands_gradients_over_in_one_order_for_every_batch():
    """What ZeRO-2 needs of data-parallel ranks: its gradient buckets are laid out in the
    order the backward hands the gradients over (post-accumulate-grad hooks, as DeepSpeed
    registers them), and the ranks' buckets are summed slice by slice. Compiled, the padded
    graph hands them over in another order than the unpadded one, so with every_batch a
    dense batch must run the unpadded graph, in the unpadded batch's order."""
    torch._dynamo.reset()
    _, model = pair()
    model.set_unpadded(True, every_batch=True)
    names = {p: n for n, p in model.named_parameters()}
    order: list[str] = []
    for p in names:
        p.register_post_accumulate_grad_hook(lambda p: order.append(names[p]))
    model.compile(backend="inductor", dynamic=True)  # trainer/compiling.py's options
    orders = []
    for lengths in ([60, 50, 40, 30], [64, 64, 64, 64], [64, 20, 64, 33]):
        order.clear()
        model.zero_grad()
        model(*varied_batch(lengths, 64)).loss.backward()
        orders.append(list(order))
    torch._dynamo.reset()
    assert len(orders[0]) == len(names)
    assert orders[1] == orders[0] and orders[2] == orders[0]


def test_packing_known_answer():
    p = Packing.from_mask(torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1]]))
    assert p.index.tolist() == [0, 1, 3, 7, 8]
    assert p.cu_seqlens.tolist() == [0, 2, 3, 5]
    assert (p.max_seqlen, p.min_seqlen, p.num_tokens) == (2, 1, 5)
    assert p.rows_of(torch.tensor([[1, 0], [0, 0], [2, 1]])).tolist() == [[1, 0], [2, 2], [4, 3]]
    x = torch.arange(5.0)[:, None]
    assert p.unpack(x)[..., 0].tolist() == [[0, 1, 0], [2, 0, 0], [0, 3, 4]]
    assert torch.equal(p.pack(p.unpack(x)), x)
    assert p.prediction_index is None
    predicted = torch.tensor([[1, 0], [0, 0], [1, 1]], dtype=torch.bool)
    q = Packing.from_mask(torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1]]), predicted)
    assert q.prediction_index.tolist() == [0, 4, 5]
    assert torch.equal(q.index, p.index)


def test_attention_path_choice():
    cpu = torch.zeros(2, 3)
    assert attention_path(cpu, 0.1) == "padded"
    assert attention_path(cpu, 0.0, "nested") == "nested"
    with pytest.raises(ValueError, match="varlen"):
        attention_path(cpu, 0.0, "varlen")
    with pytest.raises(ValueError, match="attention path"):
        attention_path(cpu, 0.0, "flash")


def test_training_mode_with_dropout_runs_and_learns():
    cfg = BertConfig.preset("tiny", vocab_size=99, max_position_embeddings=128)
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).train()
    batch = varied_batch(LENGTHS, 128)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        loss = model(*batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("cls", [BertForSequenceClassification, BertForTokenClassification])
def test_heads_match_their_padded_path(cls):
    padded, unpadded = pair(cls, config=HeadConfig(CFG, cls.architecture, ("a", "b", "c")))
    ii, ss, am, *_ = varied_batch(LENGTHS, 128)
    labels = (
        torch.randint(0, 3, (len(LENGTHS),))
        if cls is BertForSequenceClassification
        else torch.randint(0, 3, ii.shape).masked_fill(am == 0, -100)
    )
    ref, out = padded(ii, ss, am, labels=labels), unpadded(ii, ss, am, labels=labels)
    assert rel(out.loss, ref.loss) < 1e-5
    ref.loss.backward()
    out.loss.backward()
    assert_grads_close(unpadded, padded)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the varlen kernel needs CUDA")
def test_varlen_kernel_matches_padded_in_bf16():
    padded, unpadded = pair()
    padded, unpadded = padded.cuda().bfloat16().eval(), unpadded.cuda().bfloat16().eval()
    batch = [t.cuda() for t in varied_batch(LENGTHS, 128)]
    hidden, packing = unpadded.bert.encode(*batch[:3])
    assert packing is not None and attention_path(hidden, 0.0) == "varlen"
    out, ref = unpadded(*batch), padded(*batch)
    assert rel(out.loss.float(), ref.loss.float()) < 2e-2  # bf16 rounding


def test_bucket_rows_known_answers():
    """Low-precision matmuls on CPU get one of a few row counts; fp32 and other devices N."""
    bf16 = torch.empty(0, dtype=torch.bfloat16)
    assert [bucket_rows(bf16, n) for n in (0, 1, 64, 65, 1170, 2047, 5000)] == [
        0,
        64,
        64,
        128,
        1216,
        2048,
        5120,
    ]
    assert bucket_rows(bf16, 170, floor=16) == 176
    assert bucket_rows(torch.empty(0, dtype=torch.float16), 1170) == 1216
    assert bucket_rows(torch.empty(0), 1170) == 1170  # fp32: MKL builds nothing per shape
    assert bucket_rows(torch.empty(0, dtype=torch.bfloat16, device="meta"), 1170) == 1170
    with torch.autocast("cpu", torch.bfloat16):  # fp32 activations, bf16 matmuls
        assert bucket_rows(torch.empty(0), 1170) == 1216
    for n in range(1, 5000, 7):  # fewer than 1/16 more rows, past the floor
        assert 0 <= bucket_rows(bf16, n) - n < max(64, n / 16)


@pytest.mark.parametrize("weights", ["bf16", "autocast"])
def test_bf16_on_cpu_buckets_rows_and_matches_the_unbucketed_step(weights, monkeypatch):
    """Bucket rows follow the real ones through the encoder without reaching them: the loss
    and gradients are those of the same bf16 step without buckets (to kernel rounding)."""
    _, model = pair()
    if weights == "bf16":
        model = model.bfloat16()
    plain = copy.deepcopy(model)
    batch = varied_batch(LENGTHS, 128)
    rows = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(
        torch.nn.functional, "linear", lambda x, *a: rows.append(x.shape[0]) or linear(x, *a)
    )
    with torch.autocast("cpu", torch.bfloat16, enabled=weights == "autocast"):
        out = model(*batch)
    out.loss.backward()
    n, m = sum(LENGTHS), int((batch[3] != 0).sum())
    bucket = bucket_rows(torch.empty(0, dtype=torch.bfloat16), n)
    assert bucket > n and bucket in rows and n not in rows
    assert out.hidden.shape[0] == n and out.prediction_logits.shape[0] == m
    monkeypatch.setattr(unpad, "bucket_rows", lambda x, n, floor=64: n)
    with torch.autocast("cpu", torch.bfloat16, enabled=weights == "autocast"):
        ref = plain(*batch)
    ref.loss.backward()
    assert rel(out.loss.float(), ref.loss.float()) < 1e-2
    assert rel(out.hidden.float(), ref.hidden.float()) < 2e-2
    for (name, a), (_, b) in zip(model.named_parameters(), plain.named_parameters(), strict=True):
        if not name.endswith("attention.self.key.bias"):  # rounding noise (assert_grads_close)
            assert rel(a.grad.float(), b.grad.float()) < 5e-2, name


@pytest.mark.parametrize("weights", ["fp32", "autocast"])
def test_compiled_model_is_not_recompiled_per_row_count(weights):
    """Under torch.compile (dynamo alone: backend "eager"), batches of other real-token
    counts N reuse the graphs: the bf16 row bucket is rounded outside them (pad_to_bucket),
    where traced it guarded on N and compiled again at every batch."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    _, model = pair()
    model.compile(backend="eager", dynamic=True)  # trainer/compiling.py's dynamic shapes
    graphs = []
    for extra in range(5):  # N = 180 + 7 * extra
        batch = varied_batch([60, 50, 40 + 7 * extra, 30], 64, seed=extra)
        with torch.autocast("cpu", torch.bfloat16, enabled=weights == "autocast"):
            model(*batch).loss.backward()
        graphs.append(int(counters["stats"]["unique_graphs"]))
    assert graphs[0] > 0 and graphs[-1] == graphs[1], graphs
    torch._dynamo.reset()


def test_cpu_attention_runs_in_fp32_for_bf16_inputs():
    """The CPU's SDPA kernels are slower in bf16: attention casts up, and the result down."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g).bfloat16() for _ in range(3))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 5:] = False
    y = unpad.attention(q, k, v, mask, 0.0)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask
    )
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected.bfloat16())
    with torch.autocast("cpu", torch.bfloat16):  # autocast would run SDPA in bf16
        assert torch.equal(unpad.attention(q.float(), k.float(), v.float(), mask, 0.0), expected)


def test_nested_path_gives_sdpa_the_row_lengths_without_a_host_sync(monkeypatch):
    """SDPA's flash and memory-efficient kernels on jagged tensors read each tensor's
    longest and shortest row; computed lazily, each read is a host sync per layer (11 a
    step measured on CUDA before they were passed in). The CPU kernel is a different
    one, so the reads the CUDA kernels make are made here under the counter."""
    import model.unpad

    seen = []
    sdpa = model.unpad.F.scaled_dot_product_attention

    def reading_sdpa(q, k, v, **kwargs):
        with CountHostSyncs() as counter:
            extremes = [(t._get_min_seqlen(), t._get_max_seqlen()) for t in (q, k, v)]
        seen.append((counter.count, extremes))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(model.unpad.F, "scaled_dot_product_attention", reading_sdpa)
    _, unpadded = pair()
    unpadded.set_unpadded(True, attention_path="nested")
    lengths = [40, 3, 17, 64]
    unpadded(*varied_batch(lengths, 64))
    assert len(seen) == CFG.num_hidden_layers
    for syncs, extremes in seen:
        assert syncs == 0
        assert extremes == [(3, 64)] * 3


def test_attention_groups_known_answer(monkeypatch):
    from model.unpad import AttentionGroups

    monkeypatch.setattr(AttentionGroups, "MIN_ROWS", 2)
    mask = torch.zeros(4, 5, dtype=torch.long)
    for row, n in enumerate([2, 5, 1, 4]):
        mask[row, :n] = 1
    groups = Packing.from_mask(mask).attention_groups()
    # Packed rows: row 0 -> 0..1, row 1 -> 2..6, row 2 -> 7, row 3 -> 8..11.
    assert groups.order.tolist() == [2, 3, 4, 5, 6, 8, 9, 10, 11, 0, 1, 7]
    assert groups.order[groups.restore].tolist() == list(range(12))
    assert (groups.tokens, groups.rows, groups.width) == ([9, 3], [2, 2], [5, 2])
    assert groups.grid_index[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert groups.grid_index[1].tolist() == [0, 1, 2]
    assert groups.key_mask[1].tolist() == [[True, True], [True, False]]
    wide = torch.cat([mask, torch.zeros(4, 3, dtype=torch.long)], 1)[:3]  # T 8, longest 5
    few = Packing.from_mask(wide).attention_groups()  # under 2 x MIN_ROWS rows: one grid
    assert few.order is None and (few.rows, few.width) == ([3], [5])
    assert few.grid_index[0].tolist() == [0, 1, 5, 6, 7, 8, 9, 10]  # rows 2, 5, 1 tokens
