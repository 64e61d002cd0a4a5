"""Torch functions bound to the model's own names: patching torch's namespaces does not reach
them, so they are wrapped in place for the pass."""

from __future__ import annotations

import itertools
import sys
from typing import Any, Dict, List, Optional, Tuple

import torch

from .decorate import FUNCTION_TYPES, WrapperTable


def _is_torch_or_builtins(module_name: str) -> bool:
    """torch's own modules bind nothing the tracer must see; ``builtins`` (the module of
    ``object``, in every class's MRO) holds no torch function."""
    return module_name == "builtins" or module_name == "torch" or module_name.startswith("torch.")


class BoundReferences:
    """Wrap torch functions the model bound before the pass (``from torch import triu``,
    ``self.act = torch.relu``) in its modules' globals and attributes, and put them back."""

    def __init__(
        self, table: WrapperTable, model: torch.nn.Module, modules: Optional[List[torch.nn.Module]] = None
    ) -> None:
        self.table = table
        self.model = model
        self.modules = modules  # the model's modules, when the caller has them already
        self.replaced: List[Tuple[Any, str, Any, Any]] = []  # (dict-like owner, key, original, wrapper)
        # the globals of the files the model's classes come from: where constants may live too
        # (see modules.held_constants), looked into for tensors only if a pass needs them
        self.global_namespaces: List[Dict[str, Any]] = []
        self.found: Optional[List[Tuple[Any, str, Any, Any]]] = None  # what the first install replaced

    def install(self) -> None:
        """Wrap them; installed again (a ``run.PassSession``'s later passes), wrap the names found
        the first time that still hold the same function, without looking through the model again."""
        if self.found is not None:
            for namespace, key, original, wrapper in self.found:
                if namespace.get(key) is original:
                    namespace[key] = wrapper
                    self.replaced.append((namespace, key, original, wrapper))
            return
        self._find()
        self.found = list(self.replaced)

    def _find(self) -> None:
        modules = self.modules if self.modules is not None else list(self.model.modules())
        seen_globals = set()
        for cls in dict.fromkeys(map(type, modules)):  # each class once, in order
            for base in cls.__mro__:
                mod = sys.modules.get(base.__module__)
                if mod is not None and id(mod) not in seen_globals and not _is_torch_or_builtins(mod.__name__):
                    seen_globals.add(id(mod))
                    self._wrap_in(vars(mod), all_values=True)
                    self.global_namespaces.append(vars(mod))
        attributes = list(map(vars, modules))
        # the modules' own attributes, all told in one pass in C: most models bind none of torch's
        if not self.table.by_original.keys().isdisjoint(
            map(id, itertools.chain.from_iterable(map(dict.values, attributes)))
        ):
            for namespace in attributes:
                self._wrap_in(namespace, all_values=False)

    def _wrap_in(self, namespace: Dict[str, Any], all_values: bool) -> None:
        by_original, originals = self.table.by_original, self.table.originals
        if by_original.keys().isdisjoint(map(id, namespace.values())):
            return  # nothing of torch's here (checked in C: most namespaces hold none)
        if all_values:
            items = list(namespace.items())
        else:  # a module's own attributes: only plain functions can be torch's
            items = [(key, value) for key, value in namespace.items() if type(value) in FUNCTION_TYPES]
        for key, value in items:
            wrapper = by_original.get(id(value))
            if wrapper is not None and value is originals.get(id(value)):
                namespace[key] = wrapper
                self.replaced.append((namespace, key, value, wrapper))

    def uninstall(self) -> None:
        for namespace, key, original, wrapper in self.replaced:
            if namespace.get(key) is wrapper:
                namespace[key] = original
        self.replaced.clear()


__all__ = ["BoundReferences"]
