"""Patching a class through its own attribute dict (faster than ``setattr``, same effect)."""

from __future__ import annotations

import ctypes
import gc
import itertools
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

Namespace = Dict[str, Any]  # a module's or a class's real attribute dict


class ClassDict:
    """Writes into a class's own attribute dict, then tells the interpreter the class changed.

    ``setattr`` on ``torch.Tensor`` costs about 0.4 us a name (the type's caches and those of its
    subclasses are invalidated at each call), and a pass patches some 600 names twice: more
    than a small model's forward. One ``dict.update`` and one ``PyType_Modified`` (the C call
    ``setattr`` itself makes) do the same. CPython only; elsewhere ``of`` gives None and the
    patches use ``setattr``.

    A slot such as ``nb_add`` (for ``a + b``) is not touched by a dict write. That is enough
    where the class's slot already looks the method up by name at each call, which is the case
    unless the method found is a C slot's own wrapper (``has_own_slot``): ``Tensor.__add__`` is
    an ordinary method of ``TensorBase``, so ``Tensor``'s ``nb_add`` calls whatever
    ``Tensor.__add__`` is now; ``__getitem__`` is a slot wrapper, so it needs ``setattr``.
    """

    def __init__(self, cls: type, namespace: Namespace, modified: Callable[[type], None]) -> None:
        self.cls = cls
        self.namespace = namespace
        self._modified = modified  # TYPE_MODIFIED (``of`` makes none where it is None)

    @classmethod
    def of(cls, owner: object) -> Optional["ClassDict"]:
        modified = TYPE_MODIFIED
        if modified is None or not isinstance(owner, type):
            return None
        referents = gc.get_referents(owner.__dict__)
        if len(referents) != 1 or type(referents[0]) is not dict:
            return None
        return cls(owner, referents[0], modified)

    # The interpreter's method cache holds borrowed references, valid until the class is marked
    # modified: so mark it whatever happens, and let no replaced value die before that (``held``:
    # a value the model itself put there during the pass may have no other reference).
    def update(self, values: Namespace) -> None:
        """Put ``values`` in (what they replace is held by the wrapper table: see is_current)."""
        try:
            self.namespace.update(values)
        finally:
            self._modified(self.cls)

    def restore(self, originals: Namespace, shadowed: List[str], replacements: Namespace) -> None:
        # the model may have put its own values over the wrappers during the pass
        held = None if replacements.items() <= self.namespace.items() else dict(self.namespace)
        try:
            self.namespace.update(originals)
            # the names the wrappers shadowed (about 1,300 on torch.Tensor), taken out in C
            list(map(self.namespace.pop, shadowed, itertools.repeat(None)))
        finally:
            self._modified(self.cls)
        del held


def has_own_slot(original: object) -> bool:
    """The attribute is a C slot's wrapper: the class calls the slot's C function directly."""
    return type(original) is types.WrapperDescriptorType


def _type_modified_function() -> Optional[Callable[[type], None]]:
    if sys.implementation.name != "cpython":
        return None
    try:
        function = ctypes.pythonapi.PyType_Modified
    except AttributeError:  # pragma: no cover - a CPython without its C API exposed
        return None
    function.argtypes = [ctypes.py_object]
    function.restype = None
    return function


TYPE_MODIFIED = _type_modified_function()


# ----- a metaclass's call slot ----------------------------------------------------------------
# ``Cls(...)`` runs the C function in the ``tp_call`` slot of ``type(Cls)``. Words of
# ``PyTypeObject`` (CPython's C layout, unchanged from 3.8 on): tp_basicsize, tp_call, tp_flags,
# tp_base. The three Python also shows are compared first, so an unknown layout is never written.
_WORD = ctypes.sizeof(ctypes.c_void_p)
_BASICSIZE, _TP_CALL, _FLAGS, _BASE = 4, 16, 21, 32


def _word(cls: type, index: int) -> ctypes.c_void_p:
    return ctypes.c_void_p.from_address(id(cls) + index * _WORD)


def _layout_known() -> bool:
    if TYPE_MODIFIED is None:
        return False
    for cls in (type, int, ClassDict):
        flags = ctypes.c_ulong.from_address(id(cls) + _FLAGS * _WORD).value
        if _word(cls, _BASICSIZE).value != cls.__basicsize__ or flags != cls.__flags__:
            return False
        if _word(cls, _BASE).value != id(cls.__base__):
            return False
    return True


class _CallsPython:
    def __call__(self) -> None:  # pragma: no cover - never called: its class's slot is what we need
        pass


_SLOT_CALL = _word(_CallsPython, _TP_CALL).value if _layout_known() else None  # looks up __call__


def call_slot(meta: type) -> Optional[int]:
    """The address in ``meta``'s call slot (None where the layout is unknown)."""
    return _word(meta, _TP_CALL).value if _SLOT_CALL is not None else None


class CallSlot:
    """While installed, ``Cls(*args, **kwargs)`` for every class ``Cls`` of metaclass ``meta``
    runs ``function(Cls, *args, **kwargs)``; ``uninstall`` puts back the exact C function.

    ``meta.__call__ = function`` is refused for a metaclass written in C, and setting a slot
    through a class's dict cannot be undone exactly by Python (CPython keeps the slower generic
    slot afterwards). So ``function`` is put in ``meta``'s dict and the slot is pointed at
    CPython's generic one, which looks ``__call__`` up there; both are put back afterwards.
    ``usable`` is False on an interpreter whose type layout is not the one checked above.
    """

    def __init__(self, meta: type, function: Callable[..., Any]) -> None:
        self.meta = meta
        self.function = function
        namespace = ClassDict.of(meta)
        # the slot's word (made once: a few us each) and the metaclass's dict, where usable
        self._parts: Optional[Tuple[ctypes.c_void_p, ClassDict]] = None
        if _SLOT_CALL is not None and namespace is not None and "__call__" not in vars(meta):
            self._parts = (_word(meta, _TP_CALL), namespace)
        self.saved: Optional[int] = None

    @property
    def usable(self) -> bool:
        return self._parts is not None

    def install(self) -> None:
        parts = self._parts
        if parts is None or self.saved is not None:
            return
        slot, namespace = parts
        self.saved = slot.value
        namespace.update({"__call__": self.function})
        slot.value = _SLOT_CALL

    def uninstall(self) -> None:
        parts = self._parts
        if parts is None or self.saved is None:  # saved is None whenever parts is
            return
        slot, namespace = parts
        slot.value = self.saved
        self.saved = None
        namespace.restore({}, ["__call__"], {"__call__": self.function})


def namespace_of(owner: object) -> Namespace:
    """The dict that holds ``owner``'s attributes (a class's real dict, not its proxy)."""
    if isinstance(owner, type):
        class_dict = ClassDict.of(owner)
        return class_dict.namespace if class_dict is not None else dict(vars(owner))
    return vars(owner)


__all__ = ["ClassDict", "CallSlot", "TYPE_MODIFIED", "call_slot", "has_own_slot", "namespace_of"]
