"""Interventions: replace a layer's output during a traced pass (``log_forward_pass(intervene=)``).

Keys are resolved like ``layers_to_save`` keys (a label, a module address, ``:2`` for one pass,
a substring of labels, an ordinal) on a first, metadata-only pass; the second pass then runs
with the replacements. ``fn(activation, entry)`` receives the layer's output and its entry from
the first pass (labels, module, parents are known there; its ``activation`` is not set), and
returns the value that the rest of the model will use instead.

Where the replacement happens: when the operation that produced the tensor returns, so every
later use sees the new value. A module key names the module's output tensor, i.e. the operation
that produced it; uses of that tensor inside the module after it was produced see the new value
too (a forward hook would change only what the module returns; the two agree whenever the module
returns its last result, as almost every module does). An in-place operation keeps its tensor:
the new value is copied into it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from ..arguments import ArgumentTypeError, ArgumentValueError, describe
from .capture import PassHook, PassRecords, add_note
from .history.model_history import ModelHistory
from .layer_request import entries_for_key
from .records.tensor_log import TensorLogEntry

Intervention = Callable[[torch.Tensor, TensorLogEntry], torch.Tensor]


def check_intervene(intervene: Any) -> Dict[Any, Intervention]:
    """``intervene`` as a dict of key -> function; a clear error for anything else."""
    if not isinstance(intervene, Mapping):
        raise ArgumentTypeError(
            "intervene must be a dict of layer key -> function(activation, entry) returning the new "
            f"activation, e.g. {{'relu_1_2': lambda a, e: a * 0}}; got {type(intervene).__name__}."
        )
    for key, fn in intervene.items():
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise ArgumentTypeError(
                f"intervene's keys are layer labels, module addresses or positions, not {describe(key)}."
            )
        if not callable(fn):
            raise ArgumentTypeError(
                f"intervene[{key!r}] must be a function(activation, entry) returning the new activation; "
                f"got {type(fn).__name__}."
            )
        _check_signature(key, fn)
    return dict(intervene)


def _check_signature(key: Any, fn: Callable[..., Any]) -> None:
    """Refuse, before any pass, a function that cannot be called as ``fn(activation, entry)``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no readable signature (some builtins): it is tried in the pass
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise ArgumentTypeError(
            f"intervene[{key!r}] = {_name(fn)}{signature} has the wrong signature: torchlens calls it as "
            "fn(activation, entry), with the layer's output tensor and its TensorLogEntry, and uses the tensor it "
            "returns, e.g. lambda activation, entry: activation * 0."
        ) from None


class Interventions(PassHook):
    """The replacements of one pass, by position in execution order (``raw_index``): a pass hook
    whose ``on_record`` returns the replacement of each targeted record's tensor (the tracer
    then swaps it into what the call returns)."""

    def __init__(self, targets: Dict[int, Tuple[Any, Intervention, TensorLogEntry]]) -> None:
        self.targets = targets
        self.records: Optional[PassRecords] = None
        self.applied: Dict[int, str] = {}  # raw index -> label from the first pass
        self.error: Optional[BaseException] = None  # raised by (or about) an intervene function

    def pass_started(self, records: PassRecords) -> None:
        self.records = records

    def pass_ended(self) -> None:
        self.records = None

    def on_record(self, e: TensorLogEntry, tensor: torch.Tensor) -> torch.Tensor:
        target = self.targets.get(e.raw_index)
        if target is None:
            return tensor
        if self.records is not None:
            self.records.before_write(tensor)  # the replacement may be written into it
        if target[2].layer_type != e.layer_type:
            return tensor  # a changed control flow moved operations: checked after the pass
        key, fn, first = target
        try:
            return self._replace(e, tensor, target)
        except Exception as error:  # the user's function (or what it returned): not the model's error
            self.error = error
            add_note(
                error,
                f"torchlens: this error comes from intervene[{key!r}] ({_name(fn)}), applied to the output of "
                f"layer {first.label}: fix that function (it is called as fn(activation, entry) and must return "
                "a tensor).",
            )
            raise

    def _replace(
        self, e: TensorLogEntry, tensor: torch.Tensor, target: Tuple[Any, Intervention, TensorLogEntry]
    ) -> torch.Tensor:
        key, fn, first = target
        new = fn(tensor, first)
        if not isinstance(new, torch.Tensor):
            raise TypeError(
                f"intervene[{key!r}] returned {type(new).__name__} for layer {first.label}; it must return "
                "a tensor (the activation the rest of the model uses)."
            )
        e.intervened = f"replaced by intervene[{key!r}] ({_name(fn)})"
        self.applied[e.raw_index] = first.label
        if new is tensor:
            return tensor
        if e.is_inplace or e.kind != "op":  # the model holds this very tensor: change its value
            if new.shape != tensor.shape:
                raise ValueError(
                    f"intervene[{key!r}]: layer {first.label} is an in-place operation (or not an "
                    f"operation's result), so its value is changed in place; the new value must keep "
                    f"its shape {tuple(tensor.shape)}, not {tuple(new.shape)}."
                )
            tensor.copy_(new)
            return tensor
        return new


def plan_interventions(intervene: Dict[Any, Intervention], first: ModelHistory) -> Interventions:
    """Resolve the keys on the history of a first (metadata-only) pass."""
    targets: Dict[int, Tuple[Any, Intervention, TensorLogEntry]] = {}
    for key, fn in intervene.items():
        for e in entries_for_key(first, key, "intervene"):
            if e.kind in ("input", "output", "buffer"):
                raise ArgumentValueError(
                    f"intervene: {key!r} names {e.label}, an {e.kind} layer; intervene on an operation instead "
                    f"({'change the input you pass' if e.kind == 'input' else 'e.g. ' + (e.parent_layers or ['its parent'])[0]})."
                )
            if e.raw_index in targets:
                raise ArgumentValueError(
                    f"intervene: {e.label} is named by two keys, {targets[e.raw_index][0]!r} and {key!r}."
                )
            targets[e.raw_index] = (key, fn, e)
    return Interventions(targets)


def check_applied(interventions: Interventions, history: ModelHistory) -> None:
    """Every intervention reached the layer it was meant for (a replacement that changes the
    model's control flow can move later operations)."""
    labels = {e.raw_index: e.label for e in history.layer_list}
    for raw_index, (key, _, first) in interventions.targets.items():
        if interventions.applied.get(raw_index) != first.label or labels.get(raw_index) != first.label:
            raise RuntimeError(
                f"intervene[{key!r}] was meant for {first.label}, but with the earlier replacements the model ran "
                "differently (its control flow depends on the replaced values), so that operation was not where it "
                "was in the unchanged pass. Intervene on fewer layers at once, or on the earlier one only."
            )


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


__all__ = ["check_intervene", "Interventions", "plan_interventions", "check_applied"]
