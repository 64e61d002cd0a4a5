"""The public way to watch a traced pass from outside the trace wing (the training explorer
subscribes here instead of reaching into the tracer).

``observe_pass`` runs one forward pass with the decorator layer installed, keeps no values and
leaves no trace in the model (buffers such as BatchNorm statistics are put back, the random
number generators restored, the inputs deep-copied where they can be); the ``PassObserver``
sees the records as they are made. ``tensors_in`` and ``tensors_in_call`` find the tensors in
nested outputs and call arguments, at positions as the tracer names them.

Example:
    >>> import torch
    >>> from torchlens.trace.observe import PassObserver, observe_pass
    >>> class Inputs(PassObserver):
    ...     def pass_started(self, records):
    ...         self.records = records
    >>> x = torch.ones(1, 2)
    >>> observe_pass(torch.nn.Linear(2, 2), (x,), {}, Inputs())
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from .capture.args import tensors_in, tensors_in_call
from .capture.modules import BufferSnapshot
from .capture.observer import PassObserver, PassRecords
from .capture.run import run_pass
from .capture.save_plan import SavePlan


def observe_pass(model: nn.Module, args: tuple, kwargs: dict, observer: PassObserver) -> None:
    """Run ``model(*args, **kwargs)`` once, traced but saving nothing, telling ``observer``."""
    try:
        args, kwargs = copy.deepcopy((args, kwargs))
    except Exception:  # objects that cannot be copied are used as they are
        pass
    buffers = BufferSnapshot(model)
    try:
        result: Any = run_pass(model, args, kwargs, SavePlan(), random_seed=0, observer=observer)
    finally:
        buffers.restore()
    del result


__all__ = ["observe_pass", "PassObserver", "PassRecords", "tensors_in", "tensors_in_call"]
