"""Small text helpers shared by the printed summaries."""

from __future__ import annotations

import torch

_MAX_VALUE_CHARS = 400


def human_bytes(num: float) -> str:
    """``259584`` -> ``'253.5 KB'`` (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(num) < 1024 or unit == "GB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} TB"  # pragma: no cover


def tensor_preview(value: object, rows: int = 5) -> str:
    """A few rows of a saved value: the top-left corner of a tensor's last two dimensions; the
    first stored values of a sparse tensor; the repr of anything else (``activation_postfunc``
    may return a shape, a float, a dict...). Printing never fails on an unusual value."""
    if not isinstance(value, torch.Tensor):
        return _clipped(f"{type(value).__name__}: {value!r}")
    try:
        if value.layout != torch.strided:
            return _sparse_preview(value.detach(), rows)
        return _dense_preview(value.detach(), rows)
    except Exception as error:  # noqa: BLE001 - e.g. a tensor subclass that cannot be sliced
        return f"({_layout_name(value)} tensor; no preview: {type(error).__name__})"


def _dense_preview(tensor: torch.Tensor, rows: int) -> str:
    t = tensor
    while t.dim() > 2:
        t = t[0]
    if t.dim() == 2:
        t = t[:rows, :rows]
    elif t.dim() == 1:
        t = t[: rows * 2]
    text = repr(t.cpu() if t.device.type != "cpu" else t)
    return text + ("..." if t.numel() < tensor.numel() else "")


def _sparse_preview(tensor: torch.Tensor, rows: int) -> str:
    """Sparse layouts cannot be sliced: the number of stored values and the first few."""
    values = tensor._values() if tensor.layout == torch.sparse_coo else tensor.values()
    values = values.reshape(-1)
    shown = values[: rows * 2]
    text = repr(shown.cpu() if shown.device.type != "cpu" else shown)
    more = "..." if shown.numel() < values.numel() else ""
    return f"{_layout_name(tensor)} tensor with {tensor._nnz()} stored values: {text}{more}"


def _layout_name(tensor: torch.Tensor) -> str:
    return str(tensor.layout).replace("torch.", "")


def _clipped(text: str) -> str:
    return text if len(text) <= _MAX_VALUE_CHARS else text[:_MAX_VALUE_CHARS] + "..."
