"""Tensors made by calling a tensor class: ``torch.Tensor([[1, 2]])``, ``torch.FloatTensor(3)``,
``torch.cuda.LongTensor(...)`` (torch's legacy constructors).

These are calls of a class, not of a function, so the name cannot be swapped for a wrapper
(``isinstance(x, torch.FloatTensor)`` and ``x.type(torch.LongTensor)`` must keep working), and
a ``__new__`` set on the class cannot be taken back exactly. Every such call goes through the
call slot of the class's metaclass (``torch._C._TensorMeta`` for ``torch.Tensor``,
``torch.tensortype`` for the typed classes), so for the pass that slot runs ``class_call``
(``class_dict.CallSlot``): calls of the classes listed here go to the tracer like any wrapped
factory (a creation: no parents unless a tensor is passed, as in ``torch.Tensor(x)``); every
other call (``nn.Parameter(...)``, a tensor subclass) goes straight on. Outside a pass nothing
is changed, so nothing costs.

Each class has a function here that calls it (``torch_FloatTensor``): the recorded function of
its creations, which a saved history names and a replay calls.

Example:
    >>> import torch
    >>> torch_FloatTensor([1, 2]).dtype
    torch.float32
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Tuple

import torch

from .class_dict import CallSlot, call_slot
from .ops import ACTIVE, OpInfo
from .ops import layer_type as _layer_type

_get_ident = threading.get_ident
_type_call: Callable[..., torch.Tensor] = type.__call__  # an instance, not through the metaclass's slot

# torch.Tensor, then the typed classes (torch.FloatTensor, torch.cuda.LongTensor, torch.sparse...)
CLASSES: List[type] = [torch.Tensor] + sorted(
    getattr(torch, "_tensor_classes", ()), key=lambda cls: (cls.__module__, cls.__name__)
)
METACLASSES: List[type] = list(dict.fromkeys(type(cls) for cls in CLASSES))


def _constructor(cls: type) -> Tuple[str, Callable[..., torch.Tensor]]:
    def construct(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _type_call(cls, *args, **kwargs)

    name = f"{cls.__module__}.{cls.__name__}".replace(".", "_")
    construct.__name__ = construct.__qualname__ = name
    construct.__module__ = __name__  # found again by name when a saved history is loaded
    construct.__doc__ = f"``{cls.__module__}.{cls.__name__}(*args, **kwargs)``."
    return name, construct


CONSTRUCTORS: Dict[type, Callable[..., torch.Tensor]] = {}
for _cls in CLASSES:
    _name, CONSTRUCTORS[_cls] = _constructor(_cls)
    globals()[_name] = CONSTRUCTORS[_cls]
del _cls, _name

# recorded name and layer type: "Tensor"/"tensor", "FloatTensor"/"floattensor"
_INFOS: Dict[type, Tuple[Callable[..., torch.Tensor], OpInfo]] = {
    cls: (construct, OpInfo(cls.__name__, _layer_type(cls.__name__), False)) for cls, construct in CONSTRUCTORS.items()
}


def class_call(cls: type, *args: Any, **kwargs: Any) -> Any:
    """The metaclasses' ``__call__`` during a pass (no wrapper frame between it and the tracer)."""
    found = _INFOS.get(cls)
    tracer = ACTIVE.tracer
    if found is None or tracer is None or tracer.paused or tracer.thread_id != _get_ident():
        return _type_call(cls, *args, **kwargs)
    return tracer.on_call(found[0], found[1], args, kwargs)


def call_slots() -> List[CallSlot]:
    """What a wrapper table installs for a pass: one slot per metaclass (none it cannot use)."""
    slots = [CallSlot(meta, class_call) for meta in METACLASSES]
    return [slot for slot in slots if slot.usable]


def allocates_uninitialised(func_name: str, args: Any) -> bool:
    """Whether a logged class call made a tensor of sizes only (``torch.Tensor(2, 3)``), or the
    legacy method ``x.new(3)`` did (``x`` first, then sizes), whose values are whatever was in
    memory: nothing to compare a replay with.

    Example:
        >>> allocates_uninitialised("new", (torch.ones(1), 3)), allocates_uninitialised("new", (torch.ones(1), [3]))
        (True, False)
    """
    if func_name == "new" and args:
        args = args[1:]  # x.new(sizes): x (or its recorded reference) gives only dtype and device
    elif func_name not in _NAMES or not args:
        return False
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return True
    return all(type(a) is int for a in args)


_NAMES = frozenset(cls.__name__ for cls in CLASSES)
CODES = (class_call.__code__,)  # frames the tracer skips in a call stack


__all__ = ["CLASSES", "CONSTRUCTORS", "METACLASSES", "call_slot", "call_slots", "class_call", "allocates_uninitialised"]
