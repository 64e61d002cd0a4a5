"""The public way to watch a traced pass from outside the trace wing (the training explorer
subscribes here instead of reaching into the tracer).

``observe_pass`` runs one forward pass with the decorator layer installed, keeps no values and
leaves no trace in the model (buffers such as BatchNorm statistics are put back, the random
number generators restored, the inputs deep-copied where they can be); the ``PassObserver``
(a ``PassHook`` that listens: ``pass_started(records)``, ``pass_ended()``) sees the records as
they are made. ``tensors_in`` and ``tensors_in_call`` find the tensors in nested outputs and
call arguments, at positions as the tracer names them.

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

from typing import Any, Dict, Tuple

from torch import nn

from .capture import PassHook, PassRecords, SavePlan, tensors_in, tensors_in_call
from .traced_pass import traced_pass

PassObserver = PassHook  # what the training wing subscribes with: a hook that only listens


def observe_pass(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], observer: PassHook) -> None:
    """Run ``model(*args, **kwargs)`` once, traced but saving nothing, telling ``observer``."""
    traced_pass(model, args, kwargs, SavePlan(), seed=0, hooks=[observer], fresh_inputs=True, keep_buffers=True)


__all__ = ["observe_pass", "PassObserver", "PassRecords", "tensors_in", "tensors_in_call"]
