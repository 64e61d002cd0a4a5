"""Answers, not only records: questions a user brings, answered from traced passes.

``find_nonfinite`` (``tl.find_nonfinite``): which operation first produced NaN or Inf, forward
or backward; ``ModelHistory.first_nonfinite()`` gives the forward answer from a saved history.
``compare`` (``tl.compare``): where two passes part; ``compare_precision``: which ops lose
precision in a lower dtype.
"""

from ..history.extensions import provide
from .compare import compare
from .comparison import ComparedOp, CompareError, Comparison, NothingInCommonError
from .memory import MemoryReport, memory_report
from .nonfinite import find_nonfinite
from .precision import PrecisionComparison, compare_precision
from .report import NonfiniteReport, NonfiniteReportError, ParentStats
from .walk import first_nonfinite

provide("first_nonfinite", first_nonfinite)

__all__ = [
    "find_nonfinite",
    "NonfiniteReport",
    "NonfiniteReportError",
    "ParentStats",
    "compare",
    "compare_precision",
    "Comparison",
    "PrecisionComparison",
    "ComparedOp",
    "CompareError",
    "NothingInCommonError",
    "memory_report",
    "MemoryReport",
]
