"""Fused attention on meta, so a meta model's memory is a GPU's, not eager attention's.

On meta, torch runs ``scaled_dot_product_attention`` by its math path (matmul, softmax,
matmul), whose backward keeps the attention probabilities: batch x heads x seq x seq, hundreds of
MB per layer at 2048 tokens. The fused kernels a GPU (or the CPU) uses keep only q, k, v, the
output and a logsumexp. ``FusedAttention``, entered during a meta pass, runs the call by torch's
fused flash-attention operator instead (it has a meta kernel and the same saved tensors), so
autograd saves what it would save there. The traced op is the same ``scaled_dot_product_attention``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ...capture import PassRecords


class FusedAttention(TorchFunctionMode):
    """Runs meta ``scaled_dot_product_attention`` calls by the fused operator; others as they are.

    Example:
        >>> import torch
        >>> q = torch.empty(1, 2, 8, 4, device="meta", requires_grad=True)
        >>> with FusedAttention():
        ...     out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        >>> out.shape, out.grad_fn.name()
        (torch.Size([1, 2, 8, 4]), 'ScaledDotProductFlashAttentionForCpuBackward0')
    """

    def __init__(self, records: Optional[PassRecords] = None) -> None:
        super().__init__()
        self.records = records  # the pass, paused while the replacement runs: the model's op is the sdpa call

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        query = args[0] if args else kwargs.get("query")  # transformers passes them by name
        # during a traced pass torch may hand over torchlens's wrapper of the function
        if getattr(func, "__wrapped__", func) is not _SDPA or not getattr(query, "is_meta", False):
            return func(*args, **kwargs)
        if self.records is None:
            return _fused(*args, **kwargs)
        with self.records.paused():
            return _fused(*args, **kwargs)


_SDPA = F.scaled_dot_product_attention


def _fused(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    del enable_gqa  # the fused operator takes fewer k/v heads than q heads as they are
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # the fused operator takes an additive mask
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attn_mask, float("-inf")
        )
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p=dropout_p, is_causal=is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


__all__ = ["FusedAttention"]
