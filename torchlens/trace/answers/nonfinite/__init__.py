"""``find_nonfinite``: which operation first made NaN or Inf, forward or backward.

- ``search.py``: ``find_nonfinite``, the passes it runs and how it reads them.
- ``flags.py``: the save plans that keep one finiteness flag per tensor instead of its value.
- ``snapshot.py``: the model's buffers and parameters, put back after the passes.
- ``walk.py``: the producer (forward and backward) read off the flags; ``first_nonfinite``.
- ``report.py``: ``NonfiniteReport``, the answer.

Example:
    >>> import torch, torchlens as tl
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> tl.find_nonfinite(model, torch.ones(1, 2)).found
    False
"""

from .report import NonfiniteReport, NonfiniteReportError, ParentStats
from .search import RngState, find_nonfinite
from .walk import first_nonfinite

__all__ = ["find_nonfinite", "NonfiniteReport", "NonfiniteReportError", "ParentStats", "RngState", "first_nonfinite"]
