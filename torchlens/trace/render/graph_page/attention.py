"""The heat map data of decomposed attention (``log_forward_pass(decompose=("sdpa",))``) for the
graph page's details panel: the probabilities of the first batch item, one grid per head, at
most ``MAX_SIDE`` x ``MAX_SIDE`` cells (longer sides are averaged over blocks of queries or keys)
and at most ``MAX_HEADS`` heads, each cell one byte (0..255 of that head's largest value),
base64 in the page: 64 heads of 64 x 64 cells cost 350 kB of page.

Example:
    >>> import torch
    >>> m = attention_map(torch.softmax(torch.randn(2, 3, 5, 5), -1))
    >>> m["heads"], m["queries"], m["keys"], m["rows"], m["batch"]
    (3, 5, 5, 5, 2)
"""

from __future__ import annotations

import base64
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from ...records.attention import ATTENTION_TYPE
from ...records.tensor_log import TensorLogEntry

MAX_SIDE = 64
MAX_HEADS = 64


def entry_attention_map(entry: TensorLogEntry) -> Optional[Dict[str, Any]]:
    """The heat map of an attention-probability op, or None (another op, or not saved)."""
    if entry.layer_type != ATTENTION_TYPE or not isinstance(entry.activation, torch.Tensor):
        return None
    return attention_map(entry.activation)


def attention_map(probs: torch.Tensor) -> Optional[Dict[str, Any]]:
    """``probs`` ``[..., heads, queries, keys]`` as the page's heat map data (see the module doc)."""
    if probs.dim() < 2 or probs.is_meta or probs.numel() == 0:
        return None
    with torch.no_grad():
        grid = probs.detach().float()
        batch = grid.shape[0] if grid.dim() >= 4 else 1
        grid = grid.reshape(-1, *grid.shape[-3:])[0] if grid.dim() >= 3 else grid[None]
        heads, queries, keys = grid.shape
        grid = grid[:MAX_HEADS].nan_to_num(0.0)
        if queries > MAX_SIDE or keys > MAX_SIDE:  # block means keep each row's total
            grid = F.adaptive_avg_pool2d(grid[None], (min(queries, MAX_SIDE), min(keys, MAX_SIDE)))[0]
        top = grid.flatten(1).amax(1).clamp_min(1e-30)
        cells = (grid / top[:, None, None] * 255).round().clamp(0, 255).to(torch.uint8).cpu()
    grids: List[str] = [base64.b64encode(cells[h].numpy().tobytes()).decode("ascii") for h in range(cells.shape[0])]
    return {
        "heads": heads,
        "shown": len(grids),
        "queries": queries,
        "keys": keys,
        "rows": cells.shape[1],
        "cols": cells.shape[2],
        "batch": batch,
        "max": [round(float(v), 6) for v in top],
        "grids": grids,
    }


__all__ = ["attention_map", "entry_attention_map", "MAX_SIDE", "MAX_HEADS"]
