"""Unpadded BERT: the real tokens of a batch packed into one (N, H) tensor.

Every padded position costs as much as a real token in every Linear, the GELU and the
LayerNorms, but changes nothing in the real tokens' outputs (the key-padding mask keeps
it out of their attention). So the encoder packs the batch's real tokens into (N, H),
N = the number of real tokens, runs everything on them, and attends within each row.

Attention has three paths, picked per call by :func:`attention_path`:

- ``varlen``: FlashAttention's variable-length kernel
  (``torch.nn.attention.varlen.varlen_attn``) on CUDA in fp16/bf16 when no attention
  dropout is applied (the kernel has no dropout): no padding anywhere.
- ``nested``: ``scaled_dot_product_attention`` on jagged nested tensors
  (``torch.nested.nested_tensor_from_jagged``); FlashAttention or memory-efficient
  attention on CUDA, with dropout. On CPU it falls back to a math kernel, slower than
  ``padded``'s dense grids, so it is used on CPU only when asked for (tests). No bench
  switches the path; bench/model_speed.py times the step on the one picked by default.
- ``padded``: q, k, v are scattered into padded grids for attention alone and gathered
  back (the CPU default). The rows are sorted by length and cut into up to four groups
  (:class:`AttentionGroups`), each on a grid as wide as its longest row, so little
  attention goes to padding either, which pays on rows of mixed lengths like the main
  job's (mean 73 of 128): bench/length_bucketing.py and ``bench/model_speed.py --lengths
  docstrings`` time the step on them. The cost is two copies per layer and, when grouped,
  a reordering of the rows.

Rows are read where ``attention_mask`` is 1, in order; they need not be right-padded.
Position ids stay the tokens' original positions.

Row buckets (:func:`bucket_rows`): on CPU in bf16 or fp16 (weights in that dtype, or
autocast), a matmul runs on a oneDNN kernel that is built (JIT) for its exact shape and
cached. N, the batch's real tokens, differs from batch to batch, so nearly every step
would build its kernels again, which costs more than bf16 saves. There the packed rows are
rounded up to one of a few sizes: zero rows follow the N real ones through every Linear,
GELU and LayerNorm, attention never sees them, and the encoder's output drops them.
fp32 (MKL's kernels) and CUDA keep N rows. bench/precision_speed.py times fp32 against
bf16.

torch.compile: the host bookkeeping stays out of the graphs (``torch.compiler.disable``).
``Packing.from_mask`` reads the row lengths with one device sync (a graph break anyway),
and ``packed_attention`` sizes its grids by them on the host (numpy): traced, dynamo would
guard on every row's length and recompile each batch until its cache limit, then run the
model eagerly. Left out, the graphs hold the dense work between them, with symbolic N
(trainer/compiling.py; bench/compile_speed.py --explain lists the graph breaks).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

PATHS = ("auto", "varlen", "nested", "padded")


@dataclass
class Packing:
    """Where the real tokens of a (B, T) batch sit in the packed (N, ...) tensor.

    ``index`` (N,) int64: flat position ``b * T + t`` of each real token, row-major;
    ``cu_seqlens`` (B + 1,) int32: row b's tokens are packed rows
    ``cu_seqlens[b]:cu_seqlens[b + 1]``; ``slot`` (B * T,) int64: the packed row of each
    flat position (0 where padding); ``max_seqlen``: the longest row.
    """

    index: torch.Tensor
    cu_seqlens: torch.Tensor
    slot: torch.Tensor
    max_seqlen: int
    min_seqlen: int
    batch: int
    width: int
    key_mask: torch.Tensor  # (B, T) bool, True on real tokens
    # (M,) int64: flat index into (B, P) of each real MLM prediction, row-major; None when
    # no prediction mask was given. The MLM head runs on these M rows only.
    prediction_index: torch.Tensor | None = None
    lengths: list[int] = field(default_factory=list)  # each row's real tokens, on the host
    _groups: AttentionGroups | None = field(default=None, repr=False)

    @classmethod
    @torch.compiler.disable  # host bookkeeping, one device sync (module docstring)
    def from_mask(
        cls, attention_mask: torch.Tensor, predicted: torch.Tensor | None = None
    ) -> Packing:
        """Packing of a (B, T) mask, 1/True on real tokens; ``predicted`` (B, P) marks
        the real MLM predictions (True where ``masked_lm_positions`` is not padding).

        Example: mask ``[[1, 1, 0], [1, 0, 0]]`` -> index ``[0, 1, 3]``, cu_seqlens
        ``[0, 2, 3]``, max_seqlen 2; predicted ``[[1, 0], [1, 1]]`` -> prediction_index
        ``[0, 2, 3]``.
        """
        keep = attention_mask.bool()
        b, t = keep.shape
        lengths = keep.sum(1, dtype=torch.int64)
        # The one host sync: N, the longest and the shortest row, M (the number of real
        # predictions; N and M size the indices), then each row's length.
        values = [0, 0, 0, 0]
        if b:
            m = lengths.new_zeros(()) if predicted is None else predicted.sum(dtype=torch.int64)
            stats = torch.stack([lengths.sum(), lengths.max(), lengths.min(), m])
            values = torch.cat([stats, lengths]).tolist()
        n, longest, shortest = values[:3]
        index = torch.nonzero_static(keep.flatten(), size=n).squeeze(1)
        cu_seqlens = F.pad(lengths.cumsum(0).to(torch.int32), (1, 0))
        slot = torch.zeros(b * t, dtype=torch.long, device=keep.device)
        slot[index] = torch.arange(n, device=keep.device)
        prediction_index = None
        if predicted is not None:
            m = values[3]
            prediction_index = torch.nonzero_static(predicted.flatten(), size=m).squeeze(1)
        return cls(
            index, cu_seqlens, slot, longest, shortest, b, t, keep, prediction_index, values[4:]
        )

    @property
    def num_tokens(self) -> int:
        return self.index.numel()

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...): the real tokens' entries."""
        flat = x.flatten(0, 1)
        if not flat.requires_grad:
            return flat.index_select(0, self.index)
        return _Pack.apply(flat, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padding."""
        return _Unpack.apply(x, self.index, self.batch * self.width).unflatten(
            0, (self.batch, self.width)
        )

    def attention_groups(self) -> AttentionGroups:
        """The rows in groups of similar length for the ``padded`` path (computed once)."""
        if self._groups is None:
            self._groups = AttentionGroups.of(self)
        return self._groups

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Packed rows of per-row positions (B, P) -> (B, P); padding positions map to 0."""
        offsets = torch.arange(self.batch, device=positions.device)[:, None] * self.width
        return self.slot[positions.long() + offsets]


@dataclass
class AttentionGroups:
    """The rows of a packed batch, longest first, cut into groups that each attend on a
    grid of their own longest row: rows of similar length waste little on padding.

    ``order`` (N,): packed rows in group order (the rows' tokens, longest row first);
    ``restore`` (N,): its inverse; per group, ``tokens`` (its share of N), ``rows`` x
    ``width`` (its grid), ``grid_index`` (tokens,) (each token's flat grid position) and
    ``key_mask`` (rows, width) bool. One group (no reordering, ``order`` None) when there
    are fewer than ``2 * MIN_ROWS`` rows.

    Example: lengths 2, 5, 1, 4 with MIN_ROWS 2 -> rows (1, 3) on a 2 x 5 grid and rows
    (0, 2) on a 2 x 2 grid: 10 + 4 query positions instead of 4 x 5 = 20, and 2 x 5² +
    2 x 2² = 58 query-key pairs instead of 4 x 5² = 100.
    """

    MIN_ROWS = 4  # rows per group at least: a group costs one attention call
    MAX_GROUPS = 4

    order: torch.Tensor | None
    restore: torch.Tensor | None
    tokens: list[int]
    rows: list[int]
    width: list[int]
    grid_index: list[torch.Tensor]
    key_mask: list[torch.Tensor]

    @classmethod
    def of(cls, packing: Packing) -> AttentionGroups:
        """Groups of ``packing``'s rows: on CPU by the row lengths read with its one host
        sync; elsewhere (the path only runs there when asked for) one (B, T) grid, so
        that nothing more waits for the device."""
        b, t = packing.batch, packing.width
        if packing.index.device.type != "cpu":
            return cls(
                None, None, [packing.num_tokens], [b], [t], [packing.index], [packing.key_mask]
            )
        groups = max(1, min(cls.MAX_GROUPS, b // cls.MIN_ROWS))
        lengths = np.asarray(packing.lengths, dtype=np.int64)
        # Longest first; one group keeps the rows' order (its grid is as wide as the
        # longest row, not T).
        rows = np.argsort(-lengths, kind="stable") if groups > 1 else np.arange(b)
        sorted_lengths = lengths[rows]
        # Token j of the grouped order: its sorted row and its position within that row.
        row_of = np.repeat(np.arange(b), sorted_lengths)
        row_start = np.concatenate([[0], np.cumsum(sorted_lengths)])
        within = np.arange(row_start[-1]) - row_start[row_of]
        starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]  # packed start of each row
        out = cls(None, None, [], [], [], [], [])
        if groups > 1:
            order = starts[rows][row_of] + within
            restore = np.empty_like(order)
            restore[order] = np.arange(order.size)
            out.order, out.restore = torch.from_numpy(order), torch.from_numpy(restore)
        bounds = [round(i * b / groups) for i in range(groups + 1)]
        for lo, hi in itertools.pairwise(bounds):
            first, last = int(row_start[lo]), int(row_start[hi])
            width = int(sorted_lengths[lo:hi].max())
            out.tokens.append(last - first)
            out.rows.append(hi - lo)
            out.width.append(width)
            grid = (row_of[first:last] - lo) * width + within[first:last]
            out.grid_index.append(torch.from_numpy(grid))
            mask = np.arange(width) < sorted_lengths[lo:hi, None]
            out.key_mask.append(torch.from_numpy(mask))
        return out


class _Pack(torch.autograd.Function):
    """``x.index_select(0, index)`` whose backward copies instead of accumulating.

    The indices are distinct, so the gradient is a scatter with no collisions:
    ``index_copy`` does it without the atomic adds of ``index_select``'s own backward
    (``index_add``), which are slow on CPU for a grid as large as a batch's (4096, 512);
    bench/model_speed.py times the unpadded step that runs it.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        out = grad.new_zeros((ctx.rows, *grad.shape[1:]))
        return out.index_copy_(0, index, grad), None


class _Unpack(torch.autograd.Function):
    """(N, ...) -> (rows, ...) with zeros where ``index`` does not point; backward selects."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
        ctx.save_for_backward(index)
        return x.new_zeros((rows, *x.shape[1:])).index_copy_(0, index, x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        return grad.index_select(0, index), None, None


def bucket_rows(x: torch.Tensor, n: int, floor: int = 64) -> int:
    """The rows to run ``n`` rows of ``x`` on: ``n`` except for low-precision matmuls on
    CPU, where it is rounded up to a multiple of ``max(floor, 2 ** (n.bit_length() - 5))``
    (see the module docstring): fewer than ``floor`` more rows below ``16 * floor``, fewer
    than 1/16 more above, and 16 sizes per doubling of ``n``, so that the kernels built for
    them stay in oneDNN's cache.

    Example: 1170 bf16 rows on CPU -> 1216 (a multiple of 64); 5000 -> 5120 (of 256);
    fp32 or CUDA -> 1170.
    """
    if n == 0 or not low_precision_cpu(x):
        return n
    step = max(floor, 1 << max(n.bit_length() - 5, 0))
    return -(-n // step) * step


def low_precision_cpu(x: torch.Tensor) -> bool:
    """Whether matmuls on ``x`` run in bf16/fp16 on CPU (its dtype, or autocast's)."""
    if x.device.type != "cpu":
        return False
    low = (torch.bfloat16, torch.float16)
    return x.dtype in low or (
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in low
    )


def pad_to_bucket(x: torch.Tensor, like: torch.Tensor, floor: int = 64) -> torch.Tensor:
    """``x`` (n, ...) with zero rows after it, up to :func:`bucket_rows` of ``like`` (whose
    dtype decides) and n; ``x`` itself where no bucket applies (fp32, CUDA).

    The rounding is host arithmetic on n (``n.bit_length()``): traced by torch.compile, it
    would make dynamo guard on n's value and recompile at every batch, so it runs outside
    the graphs; the check before it traces (it reads only dtypes and autocast's state).
    """
    return _pad_to_bucket(x, like, floor) if low_precision_cpu(like) else x


@torch.compiler.disable  # host arithmetic on n (pad_to_bucket)
def _pad_to_bucket(x: torch.Tensor, like: torch.Tensor, floor: int) -> torch.Tensor:
    return pad_rows(x, bucket_rows(like, x.shape[0], floor))


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """(n, ...) -> (rows, ...): zeros after ``x``'s rows (``x`` itself when rows == n)."""
    extra = rows - x.shape[0]
    return x if extra == 0 else torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])


def attention_path(x: torch.Tensor, dropout_p: float, requested: str = "auto") -> str:
    """The attention path for packed ``x`` (see the module docstring).

    Raises:
        ValueError: an unknown path, or ``varlen`` where it cannot run.
    """
    if requested not in PATHS:
        raise ValueError(f"attention path must be one of {PATHS}, got {requested!r}")
    varlen_ok = x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and dropout_p == 0.0
    if requested == "varlen" and not varlen_ok:
        raise ValueError(
            "the varlen attention path needs CUDA, fp16/bf16 and no attention dropout "
            f"(got device {x.device.type}, {x.dtype}, dropout {dropout_p})"
        )
    if requested != "auto":
        return requested
    if varlen_ok and _has_varlen():
        return "varlen"
    return "nested" if x.is_cuda else "padded"


def _has_varlen() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor, dropout_p: float
) -> torch.Tensor:
    """``scaled_dot_product_attention`` of (B, A, T, D) q, k, v -> (B, A, T, D), in q's dtype.

    On CPU it runs in fp32 whatever q's dtype (bf16 weights, or autocast): the CPU kernels
    are slower in bf16 than in fp32 (mostly the backward), more than the casts cost
    (bench/precision_speed.py). On CUDA bf16 is the fast path and stays.
    """
    if q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    if attn_mask.is_floating_point():
        attn_mask = attn_mask.float()
    with torch.autocast("cpu", enabled=False):
        y = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=attn_mask, dropout_p=dropout_p
        )
    return y.to(q.dtype)


@torch.compiler.disable  # grids sized on the host (module docstring)
def packed_attention(
    qkv: torch.Tensor, packing: Packing, num_heads: int, dropout_p: float, path: str
) -> torch.Tensor:
    """Self-attention within each row of packed (N, 3H) projections -> (N, H).

    ``qkv`` holds q, k and v side by side, as one (H -> 3H) matmul gives them.
    """
    n, three_h = qkv.shape
    h = three_h // 3
    d = h // num_heads
    if path == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        q, k, v = qkv.view(n, 3, num_heads, d).unbind(1)  # each (N, A, D)
        cu, m = packing.cu_seqlens, packing.max_seqlen
        return varlen_attn(q, k, v, cu, cu, m, m).reshape(n, h)
    if path == "nested":
        offsets = packing.cu_seqlens.long()

        def jagged(t: torch.Tensor) -> torch.Tensor:  # (N, A, D) -> (B, A, j, D)
            # The row lengths' extremes are given, not left to SDPA: it reads them (flash
            # and memory-efficient kernels, backend choice) and, if absent, computes each
            # with a host sync, per tensor and per layer: nearly all of a CUDA step's syncs
            # (the packing's own is the only other; bench/model_speed.py --device cuda
            # times the step).
            nt = torch.nested.nested_tensor_from_jagged(
                t.contiguous(),
                offsets,
                min_seqlen=packing.min_seqlen,
                max_seqlen=packing.max_seqlen,
            )
            return nt.transpose(1, 2)

        q, k, v = (jagged(t) for t in qkv.view(n, 3, num_heads, d).unbind(1))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        return y.transpose(1, 2).values().reshape(n, h)
    # padded: grids for attention only, one per group of rows of similar length (see
    # AttentionGroups); padding keys are masked out.
    groups = packing.attention_groups()
    dtype = qkv.dtype
    if qkv.device.type == "cpu":  # one cast per layer, not three per group (see attention)
        qkv = qkv.float()
    x = qkv if groups.order is None else _Pack.apply(qkv, groups.order)
    outs = []
    for part, rows, width, grid_index, key_mask in zip(
        x.split(groups.tokens),
        groups.rows,
        groups.width,
        groups.grid_index,
        groups.key_mask,
        strict=True,
    ):
        grid = _Unpack.apply(part, grid_index, rows * width).view(rows, width, 3, num_heads, d)
        q, k, v = grid.permute(2, 0, 3, 1, 4)  # each (rows, A, width, D)
        y = attention(q, k, v, key_mask[:, None, None, :], dropout_p)  # (rows, A, width, D)
        outs.append(_Pack.apply(y.transpose(1, 2).reshape(rows * width, h), grid_index))
    y = outs[0] if len(outs) == 1 else torch.cat(outs)
    return (y if groups.restore is None else _Pack.apply(y, groups.restore)).to(dtype)
