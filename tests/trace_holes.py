"""Checking a history for holes against ground truth: every tensor that entered a logged operation
must be logged itself or have existed before the pass (an input, parameter, buffer, constant).

The ground truth is independent of torchlens: every tensor object alive before the pass, from
the garbage collector. A tensor that enters an operation without a record and was not alive
before the pass was made by a call torchlens did not log: a hole, whether or not torchlens
noticed (an ``untraced`` node) or not (an operation without the parent it was computed from).
"""
from __future__ import annotations

import gc
from typing import Any, Dict, List

import torch

from torchlens.history.model_history import ModelHistory


def tensors_alive() -> Dict[int, torch.Tensor]:
    """Every tensor object alive now, by id (strong references: ids stay unique while held)."""
    return {id(o): o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)}


def _walk(value: Any, found: List[torch.Tensor], depth: int = 0) -> None:
    # the containers ``save_function_args`` rebuilds (parents inside them become ParentRefs)
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif depth < 6 and type(value) in (list, tuple):
        for item in value:
            _walk(item, found, depth + 1)
    elif depth < 6 and type(value) is dict:
        for item in value.values():
            _walk(item, found, depth + 1)


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
            tensors: List[torch.Tensor] = []
            _walk(e.func_args or (), tensors)
            _walk({k: v for k, v in (e.func_kwargs or {}).items() if k != "out"}, tensors)
            for t in tensors:
                if alive_before.get(id(t)) is not t:
                    what = "parentless " if not e.parent_layers and not e.param_addresses else ""
                    found.append(f"{e.label} ({what}{e.func_name}): an argument of shape {tuple(t.shape)} "
                                 "was neither logged nor alive before the pass")
    return found


__all__ = ["tensors_alive", "holes"]
