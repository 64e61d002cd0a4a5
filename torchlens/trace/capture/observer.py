"""Subscribing to a traced pass as it runs: what another wing (the training explorer) uses
instead of reaching into the tracer.

An observer is told when the pass starts, with a read-only view of what the pass records
(``PassRecords.record_of(tensor)``: the record of a tensor made or seen so far), and when it
ends. It keeps the view only for the length of the pass.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..records.tensor_log import TensorLogEntry


class PassRecords:
    """A read-only view of the records of the pass in progress."""

    __slots__ = ("_tracer",)

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer

    def record_of(self, tensor: torch.Tensor) -> Optional[TensorLogEntry]:
        """The record of ``tensor`` if the pass has seen it (made it, or took it in), else None."""
        return self._tracer.entry_of(tensor)


class PassObserver:
    """Base class of a pass's subscribers; override what you need.

    Example:
        >>> import torch, torchlens as tl
        >>> from torchlens.trace.observe import PassObserver, observe_pass
        >>> class Count(PassObserver):
        ...     def pass_started(self, records):
        ...         self.records = records
        ...         self.seen = 0
        >>> count = Count()
        >>> observe_pass(torch.nn.Linear(2, 2), (torch.ones(1, 2),), {}, count)
    """

    def pass_started(self, records: PassRecords) -> None:
        """Called once the pass is set up, before the model runs."""

    def pass_ended(self) -> None:
        """Called when the pass ends, also when the model raised."""


__all__ = ["PassObserver", "PassRecords"]
