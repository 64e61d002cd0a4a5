"""Answers, not only records: questions a user brings, answered from traced passes.

``find_nonfinite`` (``tl.find_nonfinite``): which operation first produced NaN or Inf, forward
or backward; ``ModelHistory.first_nonfinite()`` gives the forward answer from a saved history.
"""

from ..history.extensions import provide
from .nonfinite import find_nonfinite
from .report import NonfiniteError, NonfiniteReport, ParentStats
from .walk import first_nonfinite

provide("first_nonfinite", first_nonfinite)

__all__ = ["find_nonfinite", "NonfiniteReport", "NonfiniteError", "ParentStats"]
