"""``tl.patch``: one run with some activations taken from another run, and the metric of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from ...arguments import check_arguments
from ..history.model_history import ModelHistory
from ..input_copy import as_args, as_kwargs, require_model
from .select import Index, PatchError, Selection
from .session import PatchSession, make_patches
from .targets import resolve

Keys = Union[str, int, Sequence[Union[str, int]]]


@dataclass
class PatchResult:
    """What a patched pass gave: ``value`` (the metric), ``corrupt`` (the metric of the run
    unpatched), ``clean`` (of the source run, when its outputs line up; else None), ``output``
    (what the model returned, patched), ``patched`` ({label in the run: label in the source}),
    ``mode`` (``'replay'``: only the ops downstream were re-run from the saved graph; ``'model
    run'``: the graph could not be replayed, the model ran once with the patch as an
    intervention), ``changed`` ({label: relative change of its activation}, for each op
    re-run), ``history`` (the trace of the run patched, unpatched).

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> clean = tl.log_forward_pass(model, torch.ones(1, 3, 2))
        >>> res = tl.patch(model, torch.zeros(1, 3, 2), source=clean, at="1", metric=lambda out: out.sum())
        >>> round(res.recovered, 6), res.mode, list(res.patched)
        (1.0, 'replay', ['linear_2_2'])
    """

    value: Optional[float]
    corrupt: Optional[float]
    clean: Optional[float]
    output: Any
    patched: Dict[str, str]
    selection: str
    mode: str
    history: ModelHistory
    changed: Dict[str, float] = field(default_factory=dict)

    @property
    def effect(self) -> Optional[float]:
        """``value - corrupt``: how far the patch moved the metric."""
        return None if self.value is None or self.corrupt is None else self.value - self.corrupt

    @property
    def recovered(self) -> Optional[float]:
        """``(value - corrupt) / (clean - corrupt)``: the share of the clean run's metric the
        patch brings back (1: all of it); None without a clean value or when the two agree."""
        if self.effect is None or self.clean is None or self.clean == self.corrupt:
            return None
        return self.effect / (self.clean - self.corrupt)

    def overlay(self) -> Dict[str, Any]:
        """The graph page's overlay: each op the patch re-ran, coloured by how much its
        activation changed (``|new - old| / |old|``, L2 norms), the patched ones marked."""
        return {
            "values": dict(self.changed),
            "name": "change from the patch",
            "scale": "sequential",
            "caption": f"relative L2 change of each activation; patched: {', '.join(self.patched)} ({self.selection})",
        }

    def to_html(self, path: Optional[str] = None) -> str:
        """The op-level graph page of the run patched, each op painted by how much the patch
        changed it, opened at the first patched layer (``history.to_html``)."""
        return self.history.to_html(path, overlay=self.overlay(), focus=next(iter(self.patched), None))

    def __repr__(self) -> str:
        parts = [f"value={self.value:.6g}" if self.value is not None else "value=None"]
        parts += [f"{name}={v:.6g}" for name, v in (("corrupt", self.corrupt), ("clean", self.clean)) if v is not None]
        return f"PatchResult({', '.join(parts)}, patched={list(self.patched)}, {self.selection}, mode={self.mode!r})"


def patch(
    model: nn.Module,
    input_args: Any,
    *,
    source: ModelHistory,
    at: Keys,
    metric: Optional[Callable[[Any], Any]] = None,
    positions: Index = None,
    heads: Index = None,
    index: Optional[Dict[int, Index]] = None,
    position_dim: int = 1,
    source_positions: Index = None,
    n_heads: Optional[int] = None,
    input_kwargs: Optional[Dict[str, Any]] = None,
    random_seed: Optional[int] = None,
    replay: bool = True,
) -> PatchResult:
    """Run ``model`` on ``input_args`` with the activations ``at`` names replaced by the same
    layers' activations in ``source`` (a history of another run), and score it with ``metric``.

    The run is traced once; the patched pass re-runs only the operations downstream of the
    patched layers from the saved graph (the model is run again, once, only where the graph
    cannot be replayed). Nothing of the model or of torch is changed.

    Args:
        model: the model.
        input_args: its input for the run to patch (the "corrupted" run), as for ``log_forward_pass``.
        source: ``log_forward_pass`` of the run the values come from (the "clean" run), with
            the activations of the layers ``at`` names saved.
        at: a layer label (``'add_12_204'``) or module address (``'transformer.h.3.attn'``,
            its first output when it returns several; ``'cell:4'`` for one pass), or a list of
            them, all patched together. Module addresses name the same module call in both runs;
            labels are matched like ``tl.compare`` matches ops when the runs differ in structure.
        metric: ``metric(output) -> number``, given what the model returns (e.g. a logit
            difference); None to get only ``result.output``.
        positions: positions (int, list or slice) along ``position_dim`` to patch; None: all.
        heads: heads to patch (int, list or slice): the last dimension split into ``n_heads``
            equal parts (found on the module, e.g. ``num_heads``, when not given).
        index: any other selection, ``{dim: int | list | slice}``.
        position_dim: the position dimension (1 for ``[batch, position, ...]``).
        source_positions: the source's positions to take, one per patched position, when the
            runs have different lengths (default: the same positions).
        input_kwargs, random_seed: as for ``log_forward_pass``.
        replay: False to run the model with the patch (an intervention) instead of re-running
            the ops downstream from the saved graph (the two agree; replaying is faster).

    Raises ``PatchError`` (a ``ValueError``) for a key the source lacks, shapes that do not
    line up, or a metric that does not return a plain number.

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
        >>> clean = tl.log_forward_pass(model, torch.ones(1, 2))
        >>> res = tl.patch(model, torch.zeros(1, 2), source=clean, at="0", metric=lambda out: out.sum())
        >>> abs(res.value - model(torch.ones(1, 2)).sum().item()) < 1e-6
        True
    """
    require_model(model, "patch")
    check_arguments("patch", locals())  # metric, flags, seed, position_dim, n_heads: torchlens/arguments.py
    if not isinstance(source, ModelHistory):
        raise PatchError(
            f"patch: source must be the ModelHistory of the run to take values from (tl.log_forward_pass(model, "
            f"clean_input)), not {type(source).__name__}."
        )
    selection = Selection(
        positions=positions,
        position_dim=position_dim,
        heads=heads,
        index=dict(index or {}),
        source_positions=source_positions,
    )
    session = PatchSession(model, as_args(input_args), as_kwargs(input_kwargs), metric=metric, seed=random_seed)
    targets = resolve(session.history, source, _as_list(at))
    patches = make_patches(session, targets, selection, n_heads)
    outputs, values = session.patched(patches, replay)
    output, value = session.score(outputs)
    return PatchResult(
        value=value,
        corrupt=session.corrupt_score(),
        clean=session.source_score(source),
        output=output,
        patched={t.entry.label: t.source.label for t in targets},
        selection=selection.describe(),
        mode="replay" if values else "model run",
        history=session.history,
        changed=_changes(session.history, values),
    )


def _as_list(at: Keys) -> List[Union[str, int]]:
    if isinstance(at, (str, int)):
        return [at]
    if not isinstance(at, Sequence) or not at or not all(isinstance(k, (str, int)) for k in at):
        raise PatchError(f"patch: at= must be a layer label or module address, or a list of them; got {at!r}.")
    return list(at)


def _changes(history: ModelHistory, values: Dict[str, torch.Tensor]) -> Dict[str, float]:
    changed = {}
    for label, new in values.items():
        old = history[label].activation
        old = old.detach() if isinstance(old, torch.Tensor) else old
        if not (isinstance(old, torch.Tensor) and old.is_floating_point() and old.shape == new.shape):
            continue
        base = float(old.double().norm())
        changed[label] = float((new.double() - old.double()).norm()) / (base if base > 0 else 1.0)
    return changed


__all__ = ["patch", "PatchResult"]
