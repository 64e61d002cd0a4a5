"""Finding tensors inside nested call arguments and outputs, with where each one sat.

A position is an ``int`` (positional argument), a ``str`` (keyword argument), or a tuple path
into nested lists/tuples/dicts, e.g. ``(1, 0)`` for ``args[1][0]`` or ``('hx', 1)``.

Inputs and outputs of models and modules (``tensors_in``) are also searched inside objects
that hold tensors: types registered with ``torch.utils._pytree``, dataclasses, and plain
objects' attributes (a HuggingFace ``DynamicCache`` passed as ``past_key_values`` holds the past
keys at ``('past_key_values', 'layers', 0, 'keys')``). That walk is bounded: at most
``_MAX_DEPTH`` levels and ``_MAX_VISITS`` values, each object once; modules, classes and
functions are not entered, and parameters found inside objects are left to be parameters.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..records.position import Position

_Path = Tuple[Any, ...]  # keys on the way down: ints, strings, a user's dict keys
Located = List[Tuple[Position, torch.Tensor]]

_Tensor = torch.Tensor
_MAX_DEPTH = 6
# what most non-tensor arguments of a call are (a dim, a flag, a dtype, a shape): told in one
# set lookup that they hold no tensor
_LEAVES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.Size, torch.memory_format})


def _walk(value: Any, path: _Path, out: Located, depth: int) -> None:
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


def tensors_in_call(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Located:
    """Every tensor in ``args``/``kwargs`` with its position. Flat arguments take a fast path."""
    found: Located = []
    for i, a in enumerate(args):
        if isinstance(a, _Tensor):
            found.append((i, a))
        elif type(a) not in _LEAVES and (type(a) is list or type(a) is tuple or isinstance(a, dict)):
            _walk(a, (i,), found, 1)
    if kwargs:
        for k, a in kwargs.items():
            if isinstance(a, _Tensor):
                found.append((k, a))
            elif type(a) not in _LEAVES and (type(a) is list or type(a) is tuple or isinstance(a, dict)):
                _walk(a, (k,), found, 1)
    return found


def tensors_in(value: Any) -> Located:
    """Every tensor in a (possibly nested) value, also inside objects that hold tensors (see the
    module docstring); a bare tensor has position ``()``.

    Example:
        >>> import dataclasses, torch
        >>> class Layer:
        ...     def __init__(self):
        ...         self.keys, self.values = torch.zeros(1), torch.ones(1)
        >>> @dataclasses.dataclass
        ... class Cache:
        ...     layers: list
        >>> [position for position, _ in tensors_in({"past": Cache([Layer()]), "x": torch.zeros(2)})]
        [('past', 'layers', 0, 'keys'), ('past', 'layers', 0, 'values'), 'x']
    """
    if isinstance(value, _Tensor):
        return [((), value)]
    found: Located = []
    if type(value) in _SCALARS:
        return found
    _ObjectWalk(found).walk(value, (), 0)
    return found


_SCALARS = frozenset({int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device, torch.Size})
_MAX_VISITS = 10_000
# never entered: a module's attributes are its parameters and buffers, not data it was given
_OPAQUE = (nn.Module, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


class _ObjectWalk:
    def __init__(self, found: Located) -> None:
        self.found = found
        self.seen: Set[int] = set()
        self.visits = _MAX_VISITS

    def walk(self, value: Any, path: _Path, depth: int, from_object: bool = False) -> None:
        if isinstance(value, _Tensor):
            if not (from_object and isinstance(value, nn.Parameter)):
                self.found.append((path[0] if len(path) == 1 else path, value))
            return
        cls = type(value)
        if cls in _SCALARS:
            return
        self.visits -= 1
        if depth >= _MAX_DEPTH or self.visits <= 0:
            return
        items: Iterable[Tuple[Any, Any]]
        if cls is tuple or cls is list:  # the common case first; the depth limit stops cycles
            items, is_object = enumerate(value), False
        elif cls is dict:
            items, is_object = value.items(), False
        else:
            if id(value) in self.seen:
                return
            self.seen.add(id(value))
            items, is_object = _children(value)
        for key, item in items:
            self.walk(item, path + (key,), depth + 1, is_object)


def _children(value: Any) -> Tuple[Iterable[Tuple[Any, Any]], bool]:
    """(key, child) pairs of a container or an object that may hold tensors, and whether it is
    an object (not a list, tuple or dict)."""
    if isinstance(value, dict):
        return value.items(), False
    if isinstance(value, (list, tuple)):
        return enumerate(value), False
    if isinstance(value, _OPAQUE):
        return (), True
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is not None:
        return _pytree_children(value, node), True
    if dataclasses.is_dataclass(value):
        return ((f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)), True
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return list(attributes.items()), True
    return (), True


def _pytree_children(value: Any, node: Any) -> List[Tuple[Any, Any]]:
    try:
        if node.flatten_with_keys_fn is not None:
            pairs, _ = node.flatten_with_keys_fn(value)
            return [(_key_name(key, i), child) for i, (key, child) in enumerate(pairs)]
        children, _ = node.flatten_fn(value)
        return list(enumerate(children))
    except Exception:  # a user's flatten function failed: no tensors from it rather than no trace
        return []


def _key_name(key: Any, index: int) -> Any:
    for attribute in ("name", "key", "idx"):  # GetAttrKey, MappingKey, SequenceKey
        if hasattr(key, attribute):
            return getattr(key, attribute)
    return index


def position_text(position: Position) -> str:
    """``0`` -> ``'0'``, ``'mask'`` -> ``'mask'``, ``(1, 0)`` -> ``'1[0]'``."""
    if not isinstance(position, tuple):
        return str(position)
    if not position:
        return ""
    head, *rest = position
    return str(head) + "".join(f"[{p!r}]" for p in rest)


def replace_tensors(value: Any, replace: Callable[[torch.Tensor], Any], depth: int = 0) -> Any:
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


def nested_shape(tensor: torch.Tensor) -> Tuple[Optional[int], ...]:
    """The shape of a nested tensor, ``None`` for its ragged dimensions: ``(2, None, 16)``."""
    shape: List[Optional[int]] = []
    for dim in range(tensor.dim()):
        try:
            size = tensor.size(dim)
        except RuntimeError:  # strided layout: "dimension is irregular and does not have a size"
            size = None
        shape.append(size if type(size) is int else None)  # jagged layout: a symbolic size
    return tuple(shape)
