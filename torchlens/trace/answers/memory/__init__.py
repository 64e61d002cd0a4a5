"""``memory_report``: what one training step of a model holds in memory, and its FLOPs.

- ``measure.py``: ``memory_report``, one traced pass noting what autograd saves for backward.
- ``flops.py``: each op's forward FLOPs by ``torch.utils.flop_counter``'s rules.
- ``attention.py``: fused attention on meta, counted as a GPU keeps it.
- ``optimizer_state.py``: the optimizer state a step holds.
- ``report.py``: ``MemoryReport``, the answer.

Example:
    >>> import torch, torchlens as tl
    >>> tl.memory_report(torch.nn.Linear(4, 4), torch.rand(2, 4)).params
    80
"""

from .measure import OPTIMIZER_STATES, memory_report
from .report import MemoryReport

__all__ = ["memory_report", "MemoryReport", "OPTIMIZER_STATES"]
