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
  attention on CUDA, with dropout. On CPU it falls back to a math kernel that measured
  about 4x slower than ``padded``, so it is used on CPU only when asked for (tests).
- ``padded``: q, k, v are scattered into a (B, T) grid for attention alone and gathered
  back (the CPU default). Attention is a small share of BERT's FLOPs at T <= 512 next to
  the Linears, so this keeps most of the saving at the cost of two copies per layer.

Rows are read where ``attention_mask`` is 1, in order; they need not be right-padded.
Position ids stay the tokens' original positions.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    @classmethod
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
        # The one host sync: N, the longest and the shortest row, and M, the number of
        # real predictions (N and M size the indices).
        stats = [lengths.sum(), lengths.max(), lengths.min()] if b else []
        if b and predicted is not None:
            stats.append(predicted.sum(dtype=torch.int64))
        values = torch.stack(stats).tolist() if b else [0, 0, 0, 0]
        n, longest, shortest = values[:3]
        index = torch.nonzero_static(keep.flatten(), size=n).squeeze(1)
        cu_seqlens = F.pad(lengths.cumsum(0).to(torch.int32), (1, 0))
        slot = torch.zeros(b * t, dtype=torch.long, device=keep.device)
        slot[index] = torch.arange(n, device=keep.device)
        prediction_index = None
        if predicted is not None:
            m = values[3] if b else 0
            prediction_index = torch.nonzero_static(predicted.flatten(), size=m).squeeze(1)
        return cls(index, cu_seqlens, slot, longest, shortest, b, t, keep, prediction_index)

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

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Packed rows of per-row positions (B, P) -> (B, P); padding positions map to 0."""
        offsets = torch.arange(self.batch, device=positions.device)[:, None] * self.width
        return self.slot[positions.long() + offsets]


class _Pack(torch.autograd.Function):
    """``x.index_select(0, index)`` whose backward copies instead of accumulating.

    The indices are distinct, so the gradient is a scatter with no collisions:
    ``index_copy`` does it without the atomic adds of ``index_select``'s own backward
    (``index_add``), which measured about 80 ms per call on a (4096, 512) grid on CPU.
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
            # with a host sync, per tensor and per layer (10 syncs a step on a 2-layer model).
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
    # padded: a (B, T) grid for attention only; padding keys are masked out.
    b, t = packing.batch, packing.width
    grid = packing.unpack(qkv).view(b, t, 3, num_heads, d)
    q, k, v = grid.permute(2, 0, 3, 1, 4)  # each (B, A, T, D)
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=packing.key_mask[:, None, None, :], dropout_p=dropout_p
    )  # (B, A, T, D)
    return packing.pack(y.transpose(1, 2).reshape(b, t, h))
