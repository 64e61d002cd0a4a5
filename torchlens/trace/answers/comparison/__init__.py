"""``compare``: where two passes of a model (or of a model and its port) part;
``compare_precision``: which ops lose precision in a lower dtype.

- ``compare_passes.py``: ``compare`` and ``compare_histories``, one matched pair at a time.
- ``matching.py``: which operation of one pass is which of the other.
- ``difference.py``: how far apart two saved values of one op are.
- ``report.py``: ``Comparison``, the answer, and its errors.
- ``precision.py``: ``compare_precision``, a pass against its float64 copy.

Example:
    >>> import torch, torchlens as tl
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> x = torch.ones(1, 2)
    >>> tl.compare((model, x), (model, x)).first_divergence is None
    True
"""

from .compare_passes import compare, compare_histories
from .matching import Matching, match_histories
from .precision import PrecisionComparison, compare_precision
from .report import ComparedOp, CompareError, Comparison, NothingInCommonError

__all__ = [
    "compare",
    "compare_histories",
    "compare_precision",
    "Comparison",
    "PrecisionComparison",
    "ComparedOp",
    "CompareError",
    "NothingInCommonError",
    "Matching",
    "match_histories",
]
