"""Small text helpers shared by the printed summaries."""
from __future__ import annotations

import torch


def human_bytes(num: float) -> str:
    """``259584`` -> ``'253.5 KB'`` (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(num) < 1024 or unit == "GB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} TB"  # pragma: no cover


def tensor_preview(tensor: torch.Tensor, rows: int = 5) -> str:
    """A few rows of a tensor: the top-left corner of its last two dimensions."""
    t = tensor.detach()
    while t.dim() > 2:
        t = t[0]
    if t.dim() == 2:
        t = t[:rows, :rows]
    elif t.dim() == 1:
        t = t[: rows * 2]
    text = repr(t.cpu() if t.device.type != "cpu" else t)
    return text + ("..." if t.numel() < tensor.numel() else "")
