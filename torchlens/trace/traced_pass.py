"""One traced pass, from a model and its inputs to a ``ModelHistory``: what every driver
(``log_forward_pass``, ``memory_report``, ``find_nonfinite``, ``log_generate``, ``observe_pass``)
runs instead of wiring the capture basement by hand.

Example:
    >>> import torch
    >>> from torchlens.trace.capture import SavePlan
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> traced = traced_pass(model, (torch.ones(1, 2),), {}, SavePlan(save_all=True), seed=0, fresh_inputs=True)
    >>> traced.history.layer_labels, tuple(traced.output.shape)
    (['input_1_0', 'linear_1_1', 'relu_1_2', 'output_1_3'], (1, 2))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from torch import nn

from .capture import BufferSnapshot, PassHook, PassResult, PassSession, RngState, SavePlan, run_pass
from .history.model_history import ModelHistory
from .input_copy import copy_inputs
from .postprocess import build_history


@dataclass
class TracedPass:
    """What one pass gives its driver: the raw ``result`` (for a driver that reads the records
    before post-processing), the ``history`` made from it on first use, the model's ``output``,
    the ``inputs`` the pass ran on, and a note if they could not all be copied."""

    result: PassResult
    inputs: Tuple[Tuple[Any, ...], Dict[str, Any]]
    copy_note: Optional[str] = None
    _history: Optional[ModelHistory] = field(default=None, repr=False)

    @property
    def output(self) -> Any:
        return self.result.output

    @property
    def history(self) -> ModelHistory:
        if self._history is None:
            self._history = build_history(self.result)
        return self._history


def traced_pass(
    model: nn.Module,
    args: Tuple[Any, ...],
    kwargs: Dict[str, Any],
    plan: SavePlan,
    *,
    seed: Union[int, RngState],
    hooks: Sequence[PassHook] = (),
    fresh_inputs: bool = False,
    keep_buffers: bool = False,
    lean: bool = False,
    session: Optional[PassSession] = None,
) -> TracedPass:
    """Run one traced pass of ``model`` (see ``capture.run_pass`` for ``plan``, ``seed``,
    ``hooks``, ``lean`` and ``session``).

    ``fresh_inputs``: the pass runs on a deep copy of the inputs, so the caller's objects (a
    growing KV cache, a tensor the model writes into) are left for the pass that should use
    them. ``keep_buffers``: the model's buffers (BatchNorm statistics, counters) are put back
    after the pass, as for a pass that only looks.
    """
    note = None
    if fresh_inputs:
        args, kwargs, note = copy_inputs(model, args, kwargs)
    buffers = BufferSnapshot(model) if keep_buffers else None
    try:
        result = run_pass(model, args, kwargs, plan, random_seed=seed, hooks=hooks, lean=lean, session=session)
    finally:
        if buffers is not None:
            buffers.restore()
    return TracedPass(result, (args, kwargs), note)


__all__ = ["TracedPass", "traced_pass"]
