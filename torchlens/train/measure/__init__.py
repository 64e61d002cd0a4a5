"""The numbers of a logged step: the exact statistics (``EXACT_FIELDS``) of its tensors, batched
and deferred (``exact``), and the global batch's histograms under ``torch.distributed``
(``distributed``).

Measuring a logged step's tensors together: the exact statistics and the
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
from .distributed import RankGroup, RankMismatchError, active_group, local_shard, rank_group, step_histograms
from .exact import SMALL, CopyPool, LazySummary, combine_summaries, measure, row_summaries, summary_norm, table_rows
from .layout import BLOCK, CHUNK, LayoutCache, flat_view, signature, tensor_key
from .phase import Measured, PhaseMeasure
from .rows import COMPILED, ROW_COLUMNS, merge_rows, row_stats, row_stats_eager

__all__ = [
    "SMALL",
    "CopyPool",
    "LazySummary",
    "measure",
    "row_summaries",
    "table_rows",
    "summary_norm",
    "combine_summaries",
    "RankGroup",
    "RankMismatchError",
    "active_group",
    "local_shard",
    "rank_group",
    "step_histograms",
    "Batch",
    "measure_batch",
    "measurable",
    "LayoutCache",
    "signature",
    "tensor_key",
    "Measured",
    "PhaseMeasure",
    "BLOCK",
    "CHUNK",
    "flat_view",
    "ROW_COLUMNS",
    "row_stats",
    "row_stats_eager",
    "merge_rows",
    "COMPILED",
]
