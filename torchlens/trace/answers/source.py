"""Where an answer points in the user's code: the line that called an operation (shared by
``find_nonfinite``'s and ``compare``'s answers).

Example:
    >>> import torch, torchlens as tl
    >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
    >>> source_of(h["linear_1_1"]).file.endswith(".py"), source_of(None)
    (True, None)
"""

from __future__ import annotations

from typing import Optional

from ..records.func_call import FuncCallLocation
from ..records.tensor_log import TensorLogEntry


def source_of(e: Optional[TensorLogEntry]) -> Optional[FuncCallLocation]:
    """The line that called the operation (the last frame of its call stack)."""
    if e is None or not e.call_frames:
        return None
    return e.func_call_stack[-1]


__all__ = ["source_of"]
