"""Re-running one saved operation from its parents' saved activations: the primitive that
``validate_history`` checks each op with and that ``history.rerun`` propagates changes with.

A loaded history's operations come from a file, so a replay may only produce what the record
declares: each saved parent's activation is checked against its record's shape and dtype before
the call, and the call runs under ``replay_guard.ReplayGuard`` (no side effects, outputs bounded
by the declared bytes, sparse results checked). A history traced in this process
(``ModelHistory.traced_here``) replays the model's own calls: they run unguarded, as in the
forward pass (the guard's dispatch mode sees every operator: a quarter of a validation's time)."""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from .capture import empty_out, tensors_in
from .records.tensor_log import ParentRef, TensorLogEntry
from .replay_guard import ReplayGuard, ReplayRefusedError, nbytes_of, replay_limit


def replay_entry(
    entry: TensorLogEntry,
    by_label: Dict[str, TensorLogEntry],
    overrides: Dict[str, torch.Tensor],
    guarded: bool = True,
) -> Any:
    """Run the entry's function on its parents' saved activations (``overrides``: other values
    for some parents, by label); an error message on failure. Also what ``history.rerun`` runs.
    ``guarded``: under ``ReplayGuard`` (False only for a history traced in this process).

    A loaded history's function that is not to be called (``storage.codec.UnavailableFunction``:
    not saved by name, or not an operation torchlens traces) is reported, not called; nothing
    else (generator states, arguments) is touched then either."""
    refusal = getattr(entry.func, "unavailable_reason", None)
    if isinstance(refusal, str):
        return refusal
    if not callable(entry.func):
        return f"its function is {type(entry.func).__name__}, not a callable"

    def value_of(ref: Any) -> Any:
        if isinstance(ref, ParentRef):
            saved = overrides.get(ref.label)
            if saved is None:
                parent = by_label.get(ref.label)
                if parent is None:
                    raise LookupError(f"an argument refers to {ref.label}, which is not a layer of this history")
                saved = parent.activation
                _check_against_record(parent, saved)
            return saved.clone()  # in-place replays must not change what was saved
        return ref

    try:
        args = _resolve(entry.func_args if entry.func_args is not None else _parents_as_args(entry), value_of)
        kwargs = _resolve(entry.func_kwargs or {}, value_of)
    except (LookupError, ReplayRefusedError) as error:
        return str(error)
    if type(args) not in (list, tuple) or type(kwargs) is not dict:  # a loaded history's arguments may be anything
        return f"its saved arguments are {type(args).__name__} and {type(kwargs).__name__}, not a tuple and a dict"
    if kwargs.get("out") is not None:  # a fresh out= tensor per replay: results must not alias
        kwargs["out"] = _fresh_out(kwargs["out"])
    try:
        if entry.rng_state is not None:
            cpu, cuda = entry.rng_state
            torch.set_rng_state(cpu)
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
        if guarded:
            declared = nbytes_of(entry.activation) + sum(nbytes_of(v) for v in tensors_of((args, kwargs)))
            with ReplayGuard(replay_limit(declared)):
                out = entry.func(*args, **kwargs)
        else:
            out = entry.func(*args, **kwargs)
    except ReplayRefusedError as error:
        return f"refused: {error}"
    except Exception as error:  # noqa: BLE001 - reported to the caller
        return f"{type(error).__name__}: {error}"
    if entry.is_inplace:
        if kwargs.get("out") is None and not args:
            return "an in-place operation without arguments"
        out = kwargs.get("out") if kwargs.get("out") is not None else args[0]
    if entry.output_index is None:
        return out
    return dict(tensors_in(out)).get(entry.output_index)


def _check_against_record(parent: TensorLogEntry, saved: Any) -> None:
    """A parent's saved activation is what its record says (shape, dtype): a file whose tensors
    were swapped must not reach the function."""
    if not isinstance(saved, torch.Tensor):
        raise ReplayRefusedError(f"the saved activation of {parent.label} is {type(saved).__name__}, not a tensor")
    if saved.is_nested or parent.shape is None:
        return
    if tuple(saved.shape) != tuple(parent.shape) or (parent.dtype is not None and saved.dtype != parent.dtype):
        raise ReplayRefusedError(
            f"the saved activation of {parent.label} is {tuple(saved.shape)} {saved.dtype}, but its record "
            f"declares {tuple(parent.shape)} {parent.dtype}: the history was changed after it was traced"
        )


def tensors_of(value: Any) -> list:
    """The tensors among (nested lists, tuples and dicts of) replay arguments."""
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) in (list, tuple):
        return [t for v in value for t in tensors_of(v)]
    if type(value) is dict:
        return [t for v in value.values() for t in tensors_of(v)]
    return []


def _fresh_out(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return empty_out(value)
    if type(value) in (list, tuple):
        return type(value)(_fresh_out(v) for v in value)
    return value


def _parents_as_args(entry: TensorLogEntry) -> tuple:
    return tuple(ParentRef(p) for p in entry.parent_layers)


def _resolve(value: Any, value_of: Callable[[Any], Any]) -> Any:
    if isinstance(value, ParentRef):
        return value_of(value)
    if type(value) in (list, tuple):
        return type(value)(_resolve(v, value_of) for v in value)
    if type(value) is dict:
        return {k: _resolve(v, value_of) for k, v in value.items()}
    return value


__all__ = ["replay_entry"]
