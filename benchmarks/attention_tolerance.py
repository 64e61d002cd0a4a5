"""How far decomposed attention (log_forward_pass(decompose=("sdpa",))) is from the fused call.

For each dtype and mask kind, over five seeds (batch 2, 8 heads, 128 tokens, head size 64, inputs
of unit variance): the largest absolute difference between the output of a model traced with the
decomposition and the same model's plain output (torch's own kernel), and how far each is from
the same call in float64 (their own rounding).
Prints the README's table. Run: .venv/bin/python benchmarks/attention_tolerance.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import torchlens as tl


class Attention(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.kind == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.kind == "gqa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if self.kind == "float mask":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bool: padding


def inputs(kind: str, dtype: torch.dtype, seed: int, seq: int = 128):
    g = torch.Generator().manual_seed(seed)
    kv_heads = 2 if kind == "gqa" else 8
    q = torch.randn(2, 8, seq, 64, generator=g)
    k, v = (torch.randn(2, kv_heads, seq, 64, generator=g) for _ in range(2))
    keep = torch.ones(2, 1, seq, seq, dtype=torch.bool)
    keep[1, :, :, seq // 2 :] = False  # the second sequence is padded to half length
    mask = keep if kind == "bool mask" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


def main() -> None:
    print("| dtype | mask | decomposed vs fused | fused vs float64 | decomposed vs float64 |")
    print("|---|---|---|---|---|")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for kind in ("causal", "bool mask", "float mask", "gqa"):
            worst = own = ours = 0.0
            for seed in range(5):
                model = Attention(kind)
                args = inputs(kind, dtype, seed)
                fused = model(*args)
                h = tl.log_forward_pass(model, args, decompose=("sdpa",), layers_to_save=["output"])
                out = h[h.output_layers[0]].activation
                reference = model(*(a.double() if a.is_floating_point() else a for a in args))
                worst = max(worst, (out.double() - fused.double()).abs().max().item())
                ours = max(ours, (out.double() - reference).abs().max().item())
                own = max(own, (fused.double() - reference).abs().max().item())
            print(f"| {str(dtype)[6:]} | {kind} | {worst:.1e} | {own:.1e} | {ours:.1e} |")


if __name__ == "__main__":
    main()
