"""The model's inputs for the runs a user did not ask for.

``log_forward_pass`` sometimes runs the model twice (a first pass resolves labels and positions
in ``layers_to_save``) and ``validate_model_activations`` runs it once plainly before the logged
run. A model may change what it is given: a HuggingFace ``DynamicCache`` passed as
``past_key_values`` grows by the new tokens on every call, a model may write into an input
tensor. So every extra run gets its own deep copy of the inputs, and only the run whose result
the user gets sees the user's objects: they end exactly as after one plain forward.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ..arguments import ArgumentTypeError
from .capture import check_not_capturing, replace_tensors, tensors_in


def as_args(input_args: Any) -> tuple:
    """The positional arguments of ``forward``: a tuple or list as is, anything else alone."""
    if isinstance(input_args, tuple):
        return input_args
    if isinstance(input_args, list):
        return tuple(input_args)
    return (input_args,)


def as_kwargs(input_kwargs: Any) -> Dict[str, Any]:
    """The keyword arguments of ``forward`` as a new dict; a clear error for anything else.

    Example:
        >>> as_kwargs(None), as_kwargs({"mask": 1})
        ({}, {'mask': 1})
    """
    if input_kwargs is None:
        return {}
    if not isinstance(input_kwargs, Mapping) or not all(isinstance(k, str) for k in input_kwargs):
        raise ArgumentTypeError(
            "input_kwargs must be a dict of keyword arguments for the model's forward (e.g. "
            f"input_kwargs={{'mask': mask}}), or None; got {type(input_kwargs).__name__} ({input_kwargs!r:.80}). "
            "Positional arguments go in input_args (a tensor, or a list/tuple of them)."
        )
    return dict(input_kwargs)


def refuse_module_class(model: Any, caller: str) -> None:
    """A module class (``nn.Linear``) where a model is expected: say to pass an instance."""
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise ArgumentTypeError(
            f"{caller} got the class {model.__name__}, not a model: pass an instance of it, "
            f"e.g. {model.__name__}(...) with its constructor arguments (nn.Linear(4, 3), not nn.Linear)."
        )


def require_model(model: Any, caller: str) -> None:
    """Refuse what is not a model (a number, a string, a function) before anything touches it.

    Example:
        >>> require_model(5, "validate_model_activations")
        Traceback (most recent call last):
        ...
        torchlens.arguments.ArgumentTypeError: validate_model_activations expects a torch.nn.Module as its model, got int (5). Pass ...
    """
    refuse_module_class(model, caller)
    check_not_capturing()
    if isinstance(model, nn.Module):
        return
    raise ArgumentTypeError(
        f"{caller} expects a torch.nn.Module as its model, got {type(model).__name__} ({model!r:.60}). Pass the "
        "model object itself, e.g. nn.Linear(4, 3); to trace a plain function, wrap it in an nn.Module whose "
        "forward calls it."
    )


def copy_inputs(model: nn.Module, args: tuple, kwargs: Dict[str, Any]) -> Tuple[tuple, Dict[str, Any], Optional[str]]:
    """A deep copy of ``(args, kwargs)`` for an extra run, and a note when one was not possible.

    The model's own modules, parameters and buffers are never copied (an input that refers to
    them keeps referring to them). Tensors that autograd refuses to deep-copy (non-leaf tensors
    that require grad) are cloned, keeping their autograd history. If the inputs cannot be
    deep-copied at all (an object holding a lock or an open file), only the tensors in plain
    lists, tuples and dicts are copied and the note says that other objects were shared.
    """
    memo: Dict[int, Any] = {}
    for module in model.modules():
        memo[id(module)] = module
    for tensor in list(model.parameters()) + list(model.buffers()):
        memo[id(tensor)] = tensor
    for _, tensor in tensors_in((args, kwargs)):
        if tensor.requires_grad and not tensor.is_leaf and id(tensor) not in memo:
            memo[id(tensor)] = tensor.clone()
    try:
        copied_args, copied_kwargs = copy.deepcopy((args, kwargs), memo)
        return tuple(copied_args), dict(copied_kwargs), None
    except Exception as error:  # noqa: BLE001 - any failure of a user's __deepcopy__ falls back
        note = (
            f"the inputs could not be deep-copied ({type(error).__name__}: {error}); the extra run of the "
            "model got copies of the tensors in lists, tuples and dicts but shared the other objects, "
            "which it may have changed"
        )
        return replace_tensors(args, torch.clone), replace_tensors(dict(kwargs), torch.clone), note


__all__ = ["as_args", "copy_inputs", "require_model"]
