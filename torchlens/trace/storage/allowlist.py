"""Which saved functions a loaded history may call: the operations the tracer itself records.

A saved history names each operation's function by a dotted path (``'torch.conv2d'``,
``'torch.Tensor.__add__'``, ``'torch.ops.aten.add.Tensor'``). The folder may come from anyone, so
a name is looked up without importing anything or reading attributes of arbitrary objects, and
the object found is accepted only if the tracer would have wrapped it and logged a call of it:

* a callable in the wrapper table (``capture.decorate.wrapper_table``: torch functions, ``Tensor``
  methods, ``torch.nn.functional``, ``torch.linalg``...), compared by identity;
* a ``torch.ops`` operator (``capture.opaque`` logs every one), except those that read or write
  files by name (``aten::from_file``, ``aten::save``), exist for debugging, or have an effect
  outside their result (``aten::_print``: see ``replay_guard.side_effect_reason``);
* the two functions of torchlens's own pass-through and view-write layers.

Anything else (``builtins.eval``, ``torch.load``, ``operator.attrgetter``, a torchlens internal)
loads as an ``UnavailableFunction``: printed, never called.
"""

from __future__ import annotations

import re
import sys
import types
from typing import Any, Dict, Optional, Tuple

import torch

from ...errors import TorchlensError

_ROOTS = ("torch", "torchlens", "operator", "math", "builtins")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
# wrapped torch callables that touch files by name: replaying them from a shared folder would
# read or write a file the folder chose
_NEVER_REPLAYED = frozenset({"from_file", "save", "load"})
_OP_FILE_ARGUMENTS = frozenset({"filename", "file", "path", "filepath"})
_OP_NAMESPACES_REFUSED = frozenset({"debugprims", "profiler"})


def resolve_name(name: str) -> Any:
    """The object at dotted ``name`` inside an already-imported module, or ``LookupError``.

    Only modules, classes and ``torch.ops`` namespaces are entered (a module's own dict, a
    class's attributes): no import, no module ``__getattr__``, no property of an object runs.

    Example:
        >>> import torch
        >>> resolve_name("torch.nn.functional.relu") is torch.nn.functional.relu
        True
    """
    if not isinstance(name, str) or not _DOTTED.match(name):
        raise LookupError(name)
    parts = name.split(".")
    if parts[0] not in _ROOTS:
        raise LookupError(name)
    for i in range(len(parts), 0, -1):
        value = sys.modules.get(".".join(parts[:i]))
        if value is None:
            continue
        for attribute in parts[i:]:
            value = _step(value, attribute, name)
        return value
    raise LookupError(name)


_OP_CONTAINERS: Tuple[type, ...] = (torch._ops._Ops, torch._ops._OpNamespace, torch._ops.OpOverloadPacket)


def _step(value: Any, attribute: str, name: str) -> Any:
    if type(value) is types.ModuleType:
        found = vars(value).get(attribute, _MISSING)
    elif isinstance(value, type) or isinstance(value, _OP_CONTAINERS):
        try:
            found = getattr(value, attribute)
        except (AttributeError, RuntimeError):  # torch.ops raises RuntimeError for some names
            found = _MISSING
    else:
        found = _MISSING
    if found is _MISSING:
        raise LookupError(name)
    return found


_MISSING = object()


class Refused(TorchlensError, LookupError):
    """A saved function name that a loaded history must not call; ``reason`` says why."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


_CACHE: Dict[str, Tuple[Any, Optional[str]]] = {}  # name -> (function, None) or (None, reason)


def replayable_function(name: str) -> Any:
    """The function saved as ``name`` if the tracer records calls of it; ``Refused`` otherwise.

    Example:
        >>> import torch
        >>> replayable_function("torch.conv2d") is torch.conv2d
        True
        >>> replayable_function("builtins.eval")
        Traceback (most recent call last):
        ...
        torchlens.trace.storage.allowlist.Refused: builtins.eval: not an operation torchlens traces ...
    """
    if not isinstance(name, str):
        raise Refused(repr(name), "not a function name")
    found = _CACHE.get(name)
    if found is None:
        found = _CACHE[name] = _check(name)
    func, reason = found
    if reason is not None:
        raise Refused(name, reason)
    return func


def _check(name: str) -> Tuple[Any, Optional[str]]:
    try:
        func = resolve_name(name)
    except LookupError:
        return None, "no function of this name in torch (written by another torch version?)"
    if _has_side_effects(func, name):
        return None, "an operation with an effect outside its result (printing, a global setting, a stream)"
    if _is_traced_operation(func, name):
        return func, None
    return None, (
        "not an operation torchlens traces (a torch function, Tensor method or torch.ops operator), "
        "so a loaded history never calls it"
    )


def _has_side_effects(func: Any, name: str) -> bool:
    from ..replay_guard import SIDE_EFFECT_OPERATORS, side_effect_reason

    if name.rsplit(".", 1)[-1] in SIDE_EFFECT_OPERATORS:
        return True
    if isinstance(func, torch._ops.OpOverload):
        return side_effect_reason(func) is not None
    if isinstance(func, torch._ops.OpOverloadPacket):
        return any(side_effect_reason(getattr(func, n)) is not None for n in func.overloads())
    return False


def _is_traced_operation(func: Any, name: str) -> bool:
    if name.rsplit(".", 1)[-1] in _NEVER_REPLAYED:
        return False
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return _operator_allowed(func)
    from ..capture import identity, wrapper_table, write_through_view

    if func is identity or func is write_through_view:
        return True
    table = wrapper_table()
    return table.originals.get(id(func)) is func


def _operator_allowed(op: Any) -> bool:
    packet = getattr(op, "_overloadpacket", op)
    namespace, _, op_name = str(getattr(packet, "_qualified_op_name", "")).partition("::")
    if namespace in _OP_NAMESPACES_REFUSED or op_name.rstrip("_") in _NEVER_REPLAYED:
        return False
    schemas = [op._schema] if isinstance(op, torch._ops.OpOverload) else list(packet._schemas.values())
    return not any(argument.name in _OP_FILE_ARGUMENTS for schema in schemas for argument in schema.arguments)


__all__ = ["replayable_function", "resolve_name", "Refused"]
