"""Checking a history for holes against ground truth: every tensor that entered a logged operation
must be logged itself or have existed before the pass (an input, parameter, buffer, constant).

The ground truth is independent of torchlens: every tensor object alive before the pass, from
the garbage collector. A tensor that enters an operation without a record and was not alive
before the pass was made by a call torchlens did not log: a hole, whether or not torchlens
noticed (an ``untraced`` node) or not (an operation without the parent it was computed from).
"""

from __future__ import annotations

import dataclasses
import gc
import types
from typing import Any, Dict, Iterable, List

import torch
from torch import nn

from torchlens.trace.history.model_history import ModelHistory


def tensors_alive() -> Dict[int, torch.Tensor]:
    """Every tensor object alive now, by id (strong references: ids stay unique while held).
    Objects frozen with ``gc.freeze()`` are not listed: call it in an unfrozen process."""
    return {id(o): o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)}


_MAX_DEPTH = 6
_MAX_VISITS = 10_000
# entered by no walk: a module's tensors are its parameters and buffers, not an argument's data
_NOT_ENTERED = (nn.Module, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


class _Walk:
    """The tensors in saved call arguments: inside lists, tuples (named ones too), dicts,
    dataclasses and plain objects' attributes, as far as torchlens itself looks for inputs
    (``capture.args.tensors_in``), written again here so the ground truth does not rest on it.
    Bounded: ``_MAX_DEPTH`` levels, ``_MAX_VISITS`` values, each object once."""

    def __init__(self) -> None:
        self.found: List[torch.Tensor] = []
        self.seen: set = set()
        self.visits = _MAX_VISITS

    def walk(self, value: Any, depth: int = 0) -> None:
        if isinstance(value, torch.Tensor):
            self.found.append(value)
            return
        self.visits -= 1
        if depth >= _MAX_DEPTH or self.visits <= 0 or isinstance(value, _NOT_ENTERED):
            return
        if not isinstance(value, (list, tuple, dict)):  # an object: once (objects can form cycles)
            if id(value) in self.seen:
                return
            self.seen.add(id(value))
        for item in _children(value):
            self.walk(item, depth + 1)


def _children(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        return value.values()
    if isinstance(value, (list, tuple)):
        return value
    if dataclasses.is_dataclass(value):
        return [getattr(value, f.name, None) for f in dataclasses.fields(value)]
    attributes = getattr(value, "__dict__", None)  # ParentRef and TensorLogEntry have none
    return list(attributes.values()) if isinstance(attributes, dict) else ()


def tensors_in_arguments(*values: Any) -> List[torch.Tensor]:
    walk = _Walk()
    for value in values:
        walk.walk(value)
    return walk.found


def holes(history: ModelHistory, alive_before: Dict[int, torch.Tensor]) -> List[str]:
    """The holes of a history logged with ``save_function_args=True``, one line each."""
    found = []
    for e in history:
        if e.kind == "untraced":
            found.append(f"{e.label}: untraced producer ({e.untraced_reason})")
        elif e.func_name in ("identity", "output") and not e.parent_layers:
            # a module or the model returned a tensor no logged operation made
            found.append(f"{e.label}: a {e.func_name} without parent")
        elif e.kind == "op":
            kwargs = {k: v for k, v in (e.func_kwargs or {}).items() if k != "out"}
            for t in tensors_in_arguments(e.func_args or (), kwargs):
                if alive_before.get(id(t)) is not t:
                    what = "parentless " if not e.parent_layers and not e.param_addresses else ""
                    found.append(
                        f"{e.label} ({what}{e.func_name}): an argument of shape {tuple(t.shape)} "
                        "was neither logged nor alive before the pass"
                    )
    return found


__all__ = ["tensors_alive", "holes", "tensors_in_arguments"]
