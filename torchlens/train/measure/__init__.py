"""Measuring a logged step's tensors together: the exact statistics (``EXACT_FIELDS``) and the
histogram samples of all tensors of a phase (a forward's inputs and outputs and parameters, the
parameters' gradients, the optimizer's updates) in a number of kernels that does not grow with
the number of tensors, queued on the device without a host sync, and moved to the host once
per phase (pinned memory, ``non_blocking``, an event the writer thread waits on). A phase's
layout (``layout.py``) is built once per signature of its tensors and kept (``LayoutCache``);
on a GPU, two Triton kernels (``kernels.py``) read the rows and the samples of all its tensors
of a dtype in one launch each.

Example:
    >>> import torch
    >>> from torchlens.train.measure import measure_batch
    >>> b = measure_batch([torch.ones(3), torch.zeros(4)], 2, lambda d: None)
    >>> b.rows[0][1].item(), b.rows[1][8].item(), b.samples[0].tolist()
    (1.0, 4.0, [1.0, 1.0])
"""

from .batch import Batch, measurable, measure_batch
from .layout import BLOCK, CHUNK, LayoutCache, flat_view, signature
from .rows import COMPILED, ROW_COLUMNS, merge_rows, row_stats, row_stats_eager

__all__ = [
    "Batch",
    "measure_batch",
    "measurable",
    "LayoutCache",
    "signature",
    "BLOCK",
    "CHUNK",
    "flat_view",
    "ROW_COLUMNS",
    "row_stats",
    "row_stats_eager",
    "merge_rows",
    "COMPILED",
]
