"""Answers, not only records: questions a user brings, answered from traced passes. One folder
per question, each with its face; ``display.py`` (an answer in a notebook) and ``source.py``
(the line an answer points to) serve two of them.

``find_nonfinite`` (``tl.find_nonfinite``, ``nonfinite/``): which operation first produced NaN or
Inf, forward or backward; ``ModelHistory.first_nonfinite()`` gives the forward answer from a saved
history. ``compare`` (``tl.compare``, ``compare/``): where two passes part; ``compare_precision``:
which ops lose precision in a lower dtype. ``memory_report`` (``memory/``): what a training step
holds in memory, and its FLOPs.

Example:
    >>> import torch
    >>> from torchlens.trace.answers import memory_report
    >>> memory_report(torch.nn.Linear(4, 4), torch.rand(2, 4)).grads
    80
"""

from ..history.extensions import provide
from .comparison import (
    ComparedOp,
    CompareError,
    Comparison,
    Matching,
    NothingInCommonError,
    PrecisionComparison,
    compare,
    compare_precision,
    match_histories,
)
from .memory import MemoryReport, memory_report
from .nonfinite import NonfiniteReport, NonfiniteReportError, ParentStats, RngState, find_nonfinite, first_nonfinite

provide("first_nonfinite", first_nonfinite)

__all__ = [
    "find_nonfinite",
    "NonfiniteReport",
    "NonfiniteReportError",
    "ParentStats",
    "RngState",
    "compare",
    "compare_precision",
    "Comparison",
    "PrecisionComparison",
    "ComparedOp",
    "CompareError",
    "NothingInCommonError",
    "Matching",
    "match_histories",
    "memory_report",
    "MemoryReport",
]
