"""Reading the answer off the flags: the producer (not a propagator) forward and backward, what
lies downstream, and ``ModelHistory.first_nonfinite`` (the same forward answer from saved values)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ...history.model_history import ModelHistory
from ...records.tensor_log import TensorLogEntry
from ..source import source_of
from .flags import as_finite, as_nan_free, finite_flag, read_flags
from .report import NonfiniteReport, NonfiniteReportError, nonfinite_kind, parent_stats

Flags = Dict[str, Optional[bool]]
_MADE = ("op", "untraced", "buffer")


def forward_producer(history: ModelHistory, finite: Flags) -> Optional[Tuple[str, TensorLogEntry]]:
    """(phase, entry) of the first non-finite tensor whose parents are all finite (or unknown):
    an input ('input'), a buffer read by the model ('parameter') or an operation ('forward')."""
    first_bad: Optional[TensorLogEntry] = None
    for e in history.layer_list:
        if finite.get(e.label) is not False or e.kind == "output":
            continue
        if e.kind == "input":
            return "input", e
        if e.kind == "buffer":
            return "parameter", e
        if all(finite.get(p) is not False for p in e.parent_layers):
            return "forward", e
        first_bad = first_bad or e
    return ("forward", first_bad) if first_bad is not None else None


def downstream(history: ModelHistory, starts: List[str], finite: Flags) -> List[str]:
    """Labels downstream of ``starts`` (not them) whose flag is False, in execution order."""
    reached = set(starts)
    out = []
    for e in history.layer_list:
        if e.label not in reached and any(p in reached for p in e.parent_layers):
            reached.add(e.label)
            if finite.get(e.label) is False:
                out.append(e.label)
    return out


def backward_producer(
    history: ModelHistory, order: List[str], grad_finite: Flags, leaf_finite: Flags
) -> Optional[Tuple[TensorLogEntry, List[str]]]:
    """The operation whose backward first made a non-finite gradient from a finite one, and the
    parents (labels, or parameter/input addresses) whose gradient it made non-finite.

    Backward reaches a tensor once every consumer has given its part of the gradient; the first
    tensor (in that order) with a non-finite gradient got it from a consumer whose own gradient
    was finite: that consumer's backward made it. A model output is answered by the loss
    (entry None). Leaves (parameters, inputs) come last, answered by the operations using them.
    """
    by_label = {e.label: e for e in history.layer_list}
    for label in order:
        if grad_finite.get(label) is not False:
            continue
        e = by_label[label]
        found = _finite_consumers(e, by_label, grad_finite)
        if found:
            return found[-1], [label]  # the last in forward order is the first backward reached
        if any(by_label[c].kind == "output" for c in e.child_layers):
            return None  # the loss's own gradient was not finite: see the 'loss' answer
    for address, flag in leaf_finite.items():
        if flag is not False:
            continue
        users = [
            e
            for e in history.layer_list
            if e.kind in _MADE and address in (e.param_addresses or ()) and grad_finite.get(e.label) is not False
        ]
        if not users and address.startswith("input."):  # an input leaf: the operations reading inputs
            inputs = {e.label for e in history.layer_list if e.kind == "input"}
            users = [
                e
                for e in history.layer_list
                if e.kind in _MADE and inputs & set(e.parent_layers) and grad_finite.get(e.label) is not False
            ]
        if users:
            return users[-1], [address]
    return None


def _finite_consumers(
    e: TensorLogEntry, by_label: Dict[str, TensorLogEntry], grad_finite: Flags
) -> List[TensorLogEntry]:
    return [
        by_label[c] for c in e.child_layers if by_label[c].kind in ("op", "untraced") and grad_finite.get(c) is True
    ]


def first_nonfinite(history: ModelHistory) -> NonfiniteReport:
    """``ModelHistory.first_nonfinite``: the forward answer of ``find_nonfinite`` from the
    activations saved in ``history`` (layers without a saved activation count as unknown)."""
    values = [e.activation for e in history.layer_list]
    if not any(finite_flag(v) is not None for v in values):
        raise NonfiniteReportError(
            "first_nonfinite needs saved floating activations, and this history has none (traced with "
            "layers_to_save=None, or saved nothing floating). Trace with log_forward_pass(..., layers_to_save='all'), "
            "or call torchlens.find_nonfinite(model, inputs), which needs no saved activations."
        )
    codes = dict(zip(history.layer_labels, read_flags([finite_flag(v) for v in values])))
    finite = as_finite(codes)
    answer = forward_producer(history, finite)
    if answer is None:
        return NonfiniteReport(found=False, history=history, finite=finite)
    report = describe(history, history, *answer, finite=finite)
    nan = forward_producer(history, as_nan_free(codes))
    if nan is not None and nan[1].label != report.label and report.kind != "nan":
        report.first_nan = describe(history, history, "forward", nan[1], finite=as_nan_free(codes))
        report.first_nan.kind = "nan"
    return report


def describe(
    history: ModelHistory, values: Optional[ModelHistory], phase: str, e: TensorLogEntry, *, finite: Flags
) -> NonfiniteReport:
    """The report of producer ``e`` (of ``history``), with the activations ``values`` holds
    (None: unknown); ``finite`` gives what counts as bad for ``propagated``."""
    saved = {x.label: x.activation for x in values.layer_list} if values is not None else {}
    report = NonfiniteReport(
        found=True,
        phase=phase,
        label=e.label,
        kind=nonfinite_kind(saved.get(e.label)),
        source=source_of(e) if phase == "forward" else None,
        module=e.containing_module,
        parents=[parent_stats(p, saved.get(p)) for p in e.parent_layers],
        propagated=downstream(history, [e.label], finite),
        history=values if values is not None else history,
        finite=finite,
        address=e.address,
    )
    unsaved = [p for p in e.parent_layers if saved.get(p) is None]
    if unsaved and values is history:
        report.notes.append(
            f"the activations of {', '.join(unsaved)} were not saved, so the value may have come from them; "
            "torchlens.find_nonfinite(model, inputs) checks every layer."
        )
    return report


__all__ = ["forward_producer", "backward_producer", "downstream", "first_nonfinite", "describe"]
