"""One run to patch, traced once: the patched passes of ``tl.patch`` and of every cell of
``tl.patch_sweep`` are made from it (see ``engine.py``), and scored by the user's metric."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..api import log_forward_pass
from ..capture import RngState
from ..history.model_history import ModelHistory
from ..records.tensor_log import TensorLogEntry
from ..rerun import RerunError
from .engine import ModelRunner, OutputTemplate, Patch, Replayer
from .select import PatchError, Selection
from .sites import head_count
from .targets import Target


class PatchSession:
    """The traced run to patch, its output template, and how to score a patched pass."""

    def __init__(
        self, model: nn.Module, args: tuple, kwargs: dict, metric: Optional[Callable[[Any], Any]], seed: Optional[int]
    ) -> None:
        if metric is not None and not callable(metric):
            raise PatchError(
                f"patch: metric must be a function of the model's output returning a number, e.g. "
                f"metric=lambda out: (out.logits[0, -1, 5] - out.logits[0, -1, 7]).item(); got {type(metric).__name__}."
            )
        self.model, self.metric = model, metric
        self.history = log_forward_pass(model, args, kwargs, save_function_args=True, random_seed=seed)
        self.replayer = Replayer(self.history)
        self.runner = ModelRunner(model, args, kwargs, self.history)
        self.template = OutputTemplate(model, args, kwargs, self.history)
        self.modes: Dict[str, int] = {"replay": 0, "model run": 0}

    def patched(
        self, patches: Dict[str, Patch], replay: bool = True
    ) -> Tuple[List[torch.Tensor], Dict[str, torch.Tensor]]:
        """The output tensors of the patched pass, and the new values of the ops it re-ran
        (empty when the model was run instead: ``replay=False``, or a graph that cannot be replayed)."""
        rng = RngState()  # random ops re-run with their saved generator state: put the caller's back
        try:
            try:
                if not replay:
                    raise RerunError("the model is run for each patch (replay=False)")
                values = self.replayer.run(patches)
            except RerunError:  # an op downstream cannot be re-run from the graph: run the model
                self.modes["model run"] += 1
                return self.runner.output_values(patches), {}
            self.modes["replay"] += 1
            return self.replayer.output_values(values), values
        finally:
            rng.restore()

    def score(self, outputs: List[torch.Tensor]) -> Tuple[Any, Optional[float]]:
        """(the model's output rebuilt from ``outputs``, the metric of it)."""
        out = self.template.build([t.detach() for t in outputs])  # saved activations keep their graph
        if self.metric is None:
            return out, None
        return out, metric_value(self.metric(out))

    def corrupt_score(self) -> Optional[float]:
        return self.score([e.activation for e in self.replayer.outputs])[1]

    def source_score(self, source: ModelHistory) -> Optional[float]:
        """The metric of the source run's output, when its outputs line up with this run's."""
        mine = [e.address for e in self.replayer.outputs]
        theirs = [e for e in source.layer_list if e.kind == "output"]
        if self.metric is None or [e.address for e in theirs] != mine:
            return None
        if not all(isinstance(e.activation, torch.Tensor) for e in theirs):
            return None
        return self.score([e.activation for e in theirs])[1]

    def n_heads(self, e: TensorLogEntry, given: Optional[int]) -> Optional[int]:
        """``given``, else the head count of the innermost module around ``e`` that has one."""
        return given if given is not None else head_count(self.model, e)


def metric_value(value: Any) -> float:
    """The metric's result as a float; a clear error for what cannot be one."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise PatchError(
                "patch: the metric returned a tensor that requires grad, so every patched pass would keep an "
                "autograd graph alive; return a number, e.g. with .item(), or compute it under torch.no_grad()."
            )
        if value.numel() != 1:
            raise PatchError(
                f"patch: the metric returned a tensor of shape {tuple(value.shape)}; it must return one number "
                "(e.g. a logit difference: out.logits[0, -1, a] - out.logits[0, -1, b])."
            )
        return float(value.item())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PatchError(
            f"patch: the metric returned {type(value).__name__}; it must return one number (a float or a "
            "one-element tensor)."
        ) from None


def make_patches(
    session: PatchSession, targets: List[Target], selection: Selection, n_heads: Optional[int]
) -> Dict[str, Patch]:
    """label -> function(value) -> patched value, checked once on the saved values (so a
    mismatch in shape is reported before any pass)."""
    patches: Dict[str, Patch] = {}
    for t in targets:
        heads = session.n_heads(t.entry, n_heads) if selection.heads is not None else None
        patches[t.entry.label] = _patch_of(selection, t, heads)
        patches[t.entry.label](t.entry.activation)
    return patches


def _patch_of(selection: Selection, target: Target, n_heads: Optional[int]) -> Patch:
    source, label = target.source.activation, target.entry.label
    return lambda value: selection.apply(value, source, n_heads, label)


__all__ = ["PatchSession", "metric_value", "make_patches"]
