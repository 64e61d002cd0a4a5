"""Finding tensors inside nested call arguments and outputs, with where each one sat.

A position is an ``int`` (positional argument), a ``str`` (keyword argument), or a tuple path
into nested lists/tuples/dicts, e.g. ``(1, 0)`` for ``args[1][0]`` or ``('hx', 1)``.
"""
from __future__ import annotations

from typing import Any, Iterator, List, Tuple, Union

import torch

Position = Union[int, str, Tuple[Union[int, str], ...]]

_Tensor = torch.Tensor
_MAX_DEPTH = 6


def _walk(value: Any, path: tuple, out: list, depth: int) -> None:
    if isinstance(value, _Tensor):
        out.append((path[0] if len(path) == 1 else path, value))
    elif depth < _MAX_DEPTH:
        cls = type(value)
        if cls is list or cls is tuple or (isinstance(value, tuple) and hasattr(value, "_fields")):
            for i, item in enumerate(value):
                _walk(item, path + (i,), out, depth + 1)
        elif isinstance(value, dict):
            for key, item in value.items():
                _walk(item, path + (key,), out, depth + 1)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                _walk(item, path + (i,), out, depth + 1)


def tensors_in_call(args: tuple, kwargs: dict) -> List[Tuple[Position, torch.Tensor]]:
    """Every tensor in ``args``/``kwargs`` with its position. Flat arguments take a fast path."""
    found: List[Tuple[Position, torch.Tensor]] = []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            found.append((i, a))
        elif type(a) is list or type(a) is tuple or isinstance(a, dict):
            _walk(a, (i,), found, 1)
    if kwargs:
        for k, a in kwargs.items():
            if isinstance(a, _Tensor):
                found.append((k, a))
            elif type(a) is list or type(a) is tuple or isinstance(a, dict):
                _walk(a, (k,), found, 1)
    return found


def tensors_in(value: Any) -> List[Tuple[Position, torch.Tensor]]:
    """Every tensor in a (possibly nested) value; a bare tensor has position ``()``."""
    if isinstance(value, _Tensor):
        return [((), value)]
    found: List[Tuple[Position, torch.Tensor]] = []
    if isinstance(value, (list, tuple, dict)):
        _walk_top(value, found)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            _walk(getattr(value, name, None), (name,), found, 1)
    return found


def _walk_top(value: Any, found: list) -> None:
    items: Iterator = iter(value.items()) if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        _walk(item, (key,), found, 1)


def position_text(position: Position) -> str:
    """``0`` -> ``'0'``, ``'mask'`` -> ``'mask'``, ``(1, 0)`` -> ``'1[0]'``."""
    if not isinstance(position, tuple):
        return str(position)
    if not position:
        return ""
    head, *rest = position
    return str(head) + "".join(f"[{p!r}]" for p in rest)


def replace_tensors(value: Any, replace, depth: int = 0) -> Any:
    """Copy of a nested value with each tensor ``t`` replaced by ``replace(t)``."""
    if isinstance(value, _Tensor):
        return replace(value)
    if depth >= _MAX_DEPTH:
        return value
    cls = type(value)
    if cls is list:
        return [replace_tensors(v, replace, depth + 1) for v in value]
    if cls is tuple:
        return tuple(replace_tensors(v, replace, depth + 1) for v in value)
    if cls is dict:
        return {k: replace_tensors(v, replace, depth + 1) for k, v in value.items()}
    return value
