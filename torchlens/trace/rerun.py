"""``ModelHistory.rerun``: change saved activations and recompute what follows, without the model.

Each layer downstream of a changed one is re-run from its saved function and arguments (the
replay ``validate_model_activations`` uses), with the new values of its parents and the saved
activations of the others; layers not downstream keep their saved activations.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Mapping, Union

import torch

from ..arguments import ArgumentTypeError, ArgumentValueError, describe
from ..errors import TorchlensError
from .history.extensions import provide
from .history.model_history import ModelHistory
from .layer_request import entries_for_key
from .records.meta import is_meta_history, refuse_meta
from .records.tensor_log import TensorLogEntry
from .storage import UnavailableFunction, Unsaved

Change = Union[torch.Tensor, Callable[[torch.Tensor, TensorLogEntry], torch.Tensor]]


class RerunError(TorchlensError, RuntimeError):
    """``rerun`` cannot recompute the history (the message says why and what to do)."""


def _replay_layer(
    entry: TensorLogEntry, by_label: Dict[str, TensorLogEntry], values: Dict[str, torch.Tensor], guarded: bool
) -> Any:
    """Re-run one layer's function with ``values`` for some parents (the validation replay);
    a string describing the failure if it raises."""
    from .replay import replay_entry

    with torch.no_grad():
        return replay_entry(entry, by_label, values, guarded)


def rerun(history: ModelHistory, changes: Mapping[Any, Change]) -> ModelHistory:
    """A new history in which the layers ``changes`` names have new values and everything
    downstream of them is recomputed (see ``ModelHistory.rerun``)."""
    if not isinstance(changes, Mapping) or not changes:
        raise ArgumentTypeError(
            "rerun: changes takes a non-empty dict of layer key -> new tensor (or function(activation, entry) "
            "returning it), e.g. history.rerun({{'relu_1_2': torch.zeros(1, 4)}}), not {describe(changes)}."
        )
    if is_meta_history(history):
        raise refuse_meta("rerun")
    if not any(e.func_args is not None for e in history.layer_list if e.kind == "op"):
        raise RerunError(
            "rerun needs each operation's arguments, and this history was traced without them: trace "
            "again with log_forward_pass(..., save_function_args=True)."
        )
    new_values: Dict[str, torch.Tensor] = {}
    how: Dict[str, str] = {}
    for key, change in changes.items():
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise ArgumentTypeError(
                f"rerun: changes' keys are layer labels, module addresses or positions, not {describe(key)}."
            )
        for e in entries_for_key(history, key, "rerun: changes"):
            value = change(e.activation, e) if callable(change) else change
            if not isinstance(value, torch.Tensor):
                raise ArgumentTypeError(
                    f"rerun: changes[{key!r}]: the new value of {e.label} must be a tensor, not {type(value).__name__}."
                )
            if e.label in new_values:
                raise ArgumentValueError(f"rerun: {e.label} is named by two keys of changes.")
            new_values[e.label] = value
            how[e.label] = f"replaced by rerun[{key!r}]"
    changed = set(new_values)
    by_label = {e.label: e for e in history.layer_list}
    recomputed: List[str] = []
    for e in history.layer_list:
        if e.label in new_values:
            continue
        if not any(p in new_values for p in e.parent_layers):
            continue
        _check_replayable(e, history, new_values)
        result = _replay_layer(e, by_label, new_values, guarded=not history.traced_here)
        if isinstance(result, str) or not isinstance(result, torch.Tensor):
            raise RerunError(
                f"rerun: re-running {e.label} ({e.func_name}) on the new values failed: "
                f"{result if isinstance(result, str) else type(result).__name__ + ' returned'}."
            )
        new_values[e.label] = result
        recomputed.append(e.label)
    return _new_history(history, new_values, how, changed, recomputed=recomputed)


def _check_replayable(e: TensorLogEntry, history: ModelHistory, values: Dict[str, torch.Tensor]) -> None:
    if e.func is None:
        raise RerunError(f"rerun: {e.label} is downstream of the change, but it has no function to re-run.")
    if isinstance(e.func, UnavailableFunction):
        raise RerunError(
            f"rerun: {e.label} is downstream of the change, but {e.func.unavailable_reason}. Trace the model "
            "again to recompute it."
        )
    if e.kind == "untraced":
        raise RerunError(
            f"rerun: {e.label} is downstream of the change but comes from an untraced producer: what it "
            "was computed from is unknown, so it cannot be recomputed."
        )
    if e.kind == "op" and e.func_args is None:
        raise RerunError(
            f"rerun: {e.label} is downstream of the change but its arguments were not saved; trace with "
            "save_function_args=True."
        )
    for value in _flat(e.func_args) + _flat(e.func_kwargs):
        if isinstance(value, Unsaved):
            raise RerunError(
                f"rerun: {e.label} is downstream of the change but one of its arguments could not be "
                f"saved ({value!r}), so it cannot be re-run."
            )
    for parent in e.parent_layers:
        if parent in values:
            continue
        if parent not in history or not isinstance(history[parent].activation, torch.Tensor):
            raise RerunError(
                f"rerun: {e.label} is downstream of the change and needs the activation of its parent {parent}, "
                "which was not saved (or was transformed by activation_postfunc); trace with layers_to_save='all' "
                "and no activation_postfunc."
            )


def _flat(value: Any) -> List[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flat(v)]
    return [value]


def _new_history(
    history: ModelHistory, values: Dict[str, torch.Tensor], how: Dict[str, str], changed: set, recomputed: List[str]
) -> ModelHistory:
    from .history.index import build_lookup

    entries = []
    for e in history.layer_list:
        new = copy.copy(e)  # the original history is left as it was
        pending = getattr(e, "_pending", None)
        if pending:  # a loaded entry: unread fields stay unread, in a copy of their own
            setattr(new, "_pending", dict(pending))  # noqa: B010 - a field of loaded entries only
        if e.label in values:
            value = values[e.label]
            new.activation = value
            new.shape, new.dtype = value.shape, value.dtype
            new.nbytes = value.nelement() * value.element_size()
            new.grad_fn_name = type(value.grad_fn).__name__ if value.grad_fn is not None else None
            new.gradient = None  # the gradient of the old values does not describe the new ones
            if e.label in how:
                new.intervened = how[e.label]
        entries.append(new)
    result = copy.copy(history)
    result.replace_entries(entries, build_lookup(entries, history.modules.passes))
    result.notes = list(history.notes) + [
        f"rerun: {', '.join(sorted(changed))} replaced; {len(recomputed)} layers downstream recomputed from the saved "
        "graph (the model was not run)."
    ]
    return result


provide("rerun", rerun)

__all__ = ["rerun", "RerunError"]
