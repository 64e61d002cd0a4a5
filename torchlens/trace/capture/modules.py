"""What the model is made of (module, parameter and buffer addresses), and a snapshot of the
state that tracing must leave exactly as it found it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import is_lazy

from .rng import RngState


@dataclass
class ModelInventory:
    """Addresses of the model's modules, parameters and buffers, keyed by object id."""

    module_addresses: Dict[int, str]
    module_types: Dict[str, str]
    module_children: Dict[str, List[str]]
    param_addresses: Dict[int, str]
    param_info: Dict[str, Tuple[torch.Size, int, int]]  # address -> (shape, numel, nbytes)
    buffer_addresses: Dict[int, str]
    weighted_modules: FrozenSet[str] = frozenset()  # addresses of modules holding parameters (at any depth)
    has_lazy: bool = False  # some parameter is not created yet (nn.LazyLinear before its first forward)

    # the modules (each once, in ``named_modules`` order) and parameters (each once), kept
    # so the rest of the pass's setup does not walk the tree again
    modules: List[nn.Module] = field(default_factory=list)
    parameters: List[torch.Tensor] = field(default_factory=list)
    buffers: List[torch.Tensor] = field(default_factory=list)
    # addresses of the torch.compile'd submodules (traced through the modules they wrap) and of
    # the outermost TorchScript ones (opaque): what the user is told about before a pass
    compiled: List[str] = field(default_factory=list)
    scripted: List[str] = field(default_factory=list)

    @classmethod
    def of(cls, model: nn.Module) -> "ModelInventory":
        """One walk over the module tree (``named_modules``, ``named_parameters`` and
        ``named_buffers`` would each walk it again, through generators: most of the setup cost
        of a pass on a small model)."""
        module_addresses: Dict[int, str] = {}
        module_types: Dict[str, str] = {}
        children: Dict[str, List[str]] = {"": []}
        params: Dict[int, str] = {}
        buffers: Dict[int, str] = {}
        modules: List[nn.Module] = []
        parameters: List[torch.Tensor] = []
        buffer_list: List[torch.Tensor] = []
        weighted: Set[str] = set()  # modules holding parameters, themselves or below them
        compiled: List[str] = []
        scripted: List[str] = []
        parent_of: Dict[str, str] = {}
        stack = [("", model, "")]
        while stack:  # depth first, children in registration order: named_modules' order
            address, module, parent = stack.pop()
            wraps = "_orig_mod" in module._modules and is_compiled(module)
            if wraps:
                # torch.compile(sub): the module it wraps, as sub (an OptimizedModule always holds one)
                module = module._modules["_orig_mod"]  # type: ignore[assignment]
            if id(module) in module_addresses:
                continue
            if address and (wraps or isinstance(module, _ScriptModule)):
                if wraps:
                    compiled.append(address)
                if isinstance(module, _ScriptModule) and not any(address.startswith(s + ".") for s in scripted):
                    scripted.append(address)
            module_addresses[id(module)] = address
            module_types[address] = type(module).__name__
            modules.append(module)
            if address:  # its parent was visited before it (depth first): its list exists
                children[parent].append(address)
                children[address] = []
                parent_of[address] = parent
            prefix = address + "." if address else ""
            holds = False
            for name, p in module._parameters.items():
                if p is not None and id(p) not in params:
                    params[id(p)] = prefix + name
                    parameters.append(p)
                    holds = True
            ancestor = address
            while holds and ancestor and ancestor not in weighted:  # it and its ancestors (not the root)
                weighted.add(ancestor)
                ancestor = parent_of[ancestor]
            if module._buffers:  # most modules have none, and leaves no submodules: skip the loops
                for name, b in module._buffers.items():
                    if b is not None and id(b) not in buffers:
                        buffers[id(b)] = prefix + name
                        buffer_list.append(b)
            if module._modules:
                subs = [(prefix + name, sub, address) for name, sub in module._modules.items() if sub is not None]
                stack.extend(reversed(subs))
        # laziness is a class (UninitializedParameter): one parameter of each class tells
        has_lazy = any(map(is_lazy, {type(p): p for p in parameters}.values()))
        inventory = cls(
            module_addresses,
            module_types,
            children,
            params,
            param_info={},
            buffer_addresses=buffers,
            weighted_modules=frozenset(weighted),
            has_lazy=has_lazy,
            modules=modules,
            parameters=parameters,
            buffers=buffer_list,
            compiled=compiled,
            scripted=scripted,
        )
        inventory.describe_parameters()
        return inventory

    def buffers_copied_at_once(self) -> List[torch.Tensor]:
        """The buffers a pass may update in place without an operation that says so, so their
        records are copied when made: those of modules in training mode (``batch_norm``'s
        running statistics) and of every module but torch.nn's own classes (whose forward in
        eval mode writes no buffer), all of them while a lazy module is not materialised."""
        if self.has_lazy:
            return list(self.buffers)
        return [
            b
            for m in self.modules
            if m._buffers and (m.training or not type(m).__module__.startswith("torch.nn."))
            for b in m._buffers.values()
            if b is not None
        ]

    def describe_parameters(self) -> None:
        """``param_info`` of the parameters that exist (a lazy one has no shape yet)."""
        info: Dict[str, Tuple[torch.Size, int, int]] = {}
        for p, address in zip(self.parameters, self.param_addresses.values()):
            if not (self.has_lazy and is_lazy(p)):
                info[address] = (p.shape, p.numel(), p.numel() * p.element_size())
        self.param_info = info

    def describe_materialised(self) -> None:
        """After a pass that created lazy parameters: their shapes, and the modules' new types
        (a ``LazyLinear`` becomes a ``Linear``). The objects, so their ids, are unchanged."""
        self.describe_parameters()
        for module in self.modules:
            self.module_types[self.module_addresses[id(module)]] = type(module).__name__


_ScriptModule = torch.jit.ScriptModule


def is_compiled(module: nn.Module) -> bool:
    """``torch.compile(module)``: an ``OptimizedModule`` holding the original as ``_orig_mod``."""
    return any(cls.__name__ == "OptimizedModule" for cls in type(module).__mro__)


def traced_modules(model: nn.Module) -> Iterator[Tuple[str, nn.Module, bool]]:
    """``(address, module, compiled)`` in ``named_modules`` order, addressed as a pass addresses
    them (``ModelInventory``): a ``torch.compile``d submodule is the module it wraps, at its own
    address (``sub.0``, not ``sub._orig_mod.0``), with ``compiled`` True."""
    seen = set()
    stack = [("", model)]
    while stack:
        address, module = stack.pop()
        compiled = "_orig_mod" in module._modules and is_compiled(module)
        if compiled:  # an OptimizedModule always holds the module it wraps
            module = module._modules["_orig_mod"]  # type: ignore[assignment]
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield address, module, compiled
        prefix = address + "." if address else ""
        stack.extend(reversed([(prefix + name, sub) for name, sub in module._modules.items() if sub is not None]))


def traced_addresses(model: nn.Module) -> Tuple[Set[str], Set[str]]:
    """The model's module addresses and buffer addresses, as a pass addresses them."""
    modules = list(traced_modules(model))
    buffers = {
        f"{address}.{name}" if address else name
        for address, module, _ in modules
        for name, buffer in module._buffers.items()
        if buffer is not None
    }
    return {address for address, _, _ in modules}, buffers


_Tensor = torch.Tensor
# nn.Module's own attributes: parameters, buffers and submodules are inventoried, hooks are
# functions. Leaving them out (a set difference, in C) makes the scan of a module cheap.
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
_SCALARS = frozenset((bool, int, float, str, type(None)))


def tensors_held(
    namespace: Dict[str, Any], found: Dict[int, torch.Tensor], depth: int = 2, seen: Optional[Dict[int, int]] = None
) -> None:
    """Add the tensors among ``namespace``'s values, and inside its lists, tuples and dicts
    (``depth`` levels), to ``found``. ``seen``: containers already looked into (id -> levels),
    shared by calls over namespaces that hold the same ones (every module's ``__builtins__``)."""
    kinds = _KINDS
    for key in namespace.keys() - _MODULE_INTERNALS:
        value = namespace[key]
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(value)
        if kind == _TENSOR:
            found[id(value)] = value
        elif kind == _CONTAINER and depth and value and not _only_scalars(value):
            _held_in(value, found, depth - 1, seen)


def _only_scalars(container: Any) -> bool:
    """A tuple or list of plain numbers and strings (a convolution's ``kernel_size``, a
    layer's shape): told in C, without a Python loop over it."""
    return type(container) in (tuple, list) and _SCALARS.issuperset(map(type, container))


def _held_in(container: Any, found: Dict[int, torch.Tensor], depth: int, seen: Optional[Dict[int, int]]) -> None:
    if seen is not None:  # the caller keeps the containers alive, so their ids stay theirs
        if seen.get(id(container), -1) >= depth:
            return
        seen[id(container)] = depth
    kinds = _KINDS
    for value in container.values() if isinstance(container, dict) else container:
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(value)
        if kind == _TENSOR:
            found[id(value)] = value
        elif kind == _CONTAINER and depth and value and not _only_scalars(value):
            _held_in(value, found, depth - 1, seen)


def held_constants(modules: List[nn.Module], global_namespaces: List[Dict[str, Any]]) -> Dict[int, torch.Tensor]:
    """The tensors the modules hold as attributes (also inside lists, tuples and dicts) and those
    among the globals of the model's source files, by id: where a model's constants mostly live.
    Looked at only when a pass meets a tensor it has no record of (``Tracer._is_untraced``):
    most passes never do, and on GPT-2 the look costs about 0.3 ms.

    Example:
        >>> layer = nn.Linear(1, 1)
        >>> layer.scale = torch.ones(1)
        >>> list(held_constants([layer], [{"table": [torch.zeros(1)]}]).values())
        [tensor([1.]), tensor([0.])]
    """
    found: Dict[int, torch.Tensor] = {}
    for module in modules:
        tensors_held(module.__dict__, found)
    seen: Dict[int, int] = {}  # every file's globals hold __builtins__: looked into once
    for namespace in global_namespaces:
        tensors_held(namespace, found, depth=1, seen=seen)
    return found


# What a value is to the scans above, by its type: isinstance on torch.Tensor goes through its
# metaclass (slow, and most of the scan of a module's globals). Cached only for types whose
# instances cannot claim another class: isinstance also reads ``__class__``, which a proxy or
# mock may redefine.
_OTHER, _TENSOR, _CONTAINER = 0, 1, 2
_KINDS: Dict[Any, int] = dict.fromkeys(_SCALARS, _OTHER)
_C_SLOT = type(object.__getattribute__)
_PROXIES: Set[Any] = set()  # classes that may claim another class: their instances are asked each time


def _kind(value: Any) -> int:
    kind = _TENSOR if isinstance(value, _Tensor) else _CONTAINER if isinstance(value, (list, tuple, dict)) else _OTHER
    cls = type(value)
    if cls in _PROXIES:  # known: asked each time (a HuggingFace config, in every module of its model)
        return kind
    honest = all(
        "__class__" not in vars(base) and type(vars(base).get("__getattribute__", object.__getattribute__)) is _C_SLOT
        for base in cls.__mro__[:-1]
    )
    if len(_KINDS) + len(_PROXIES) < 10_000:  # bounded: classes made on the fly would pile up
        if honest:
            _KINDS[cls] = kind
        else:
            _PROXIES.add(cls)
    return kind


class LazyInitialisation:
    """Lazy modules (``nn.LazyLinear``) create their parameters in their first forward call.

    During a traced pass they do so as in a plain forward: from the caller's random streams (not
    the pass's seed, which the caller's streams then advance past, as a plain forward would),
    and without the initialisation being logged as operations of the model. Two hooks around
    the module's own initialising pre-hook do this; ``remove`` takes them away.
    """

    def __init__(self, model: nn.Module, tracer: Any, caller_rng: RngState) -> None:
        self.tracer = tracer
        self.caller_rng = caller_rng
        self.pass_rng: Any = None
        self.handles = []
        for module in model.modules():
            if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
                self.handles.append(module.register_forward_pre_hook(self._before, prepend=True))
                self.handles.append(module.register_forward_pre_hook(self._after))

    def _before(self, module: Any, args: Any) -> None:  # a lazy module (LazyModuleMixin)
        if not module.has_uninitialized_params():
            return
        self.pass_rng = RngState()
        self.caller_rng.restore()
        self.tracer.paused = True

    def _after(self, module: nn.Module, args: Any) -> None:
        if self.pass_rng is None:
            return
        self.caller_rng.capture()  # the caller's streams, advanced by the initialisation
        self.pass_rng.restore()
        self.pass_rng = None
        self.tracer.paused = False

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass
class ModelState:
    """Flags and attributes of a model that a pass must not change (restored on exit)."""

    training: List[Tuple[nn.Module, bool]] = field(default_factory=list)
    requires_grad: List[Tuple[torch.Tensor, bool]] = field(default_factory=list)

    @classmethod
    def of(cls, model: nn.Module, inventory: Optional["ModelInventory"] = None) -> "ModelState":
        modules = inventory.modules if inventory is not None else list(model.modules())
        parameters = inventory.parameters if inventory is not None else list(model.parameters())
        return cls([(m, m.training) for m in modules], [(p, p.requires_grad) for p in parameters])

    def restore(self) -> None:
        for m, training in self.training:
            if m.training != training:
                m.training = training
        for p, flag in self.requires_grad:
            if p.requires_grad != flag:
                p.requires_grad_(flag)


class BufferSnapshot:
    """The model's buffers (objects and values), to undo a metadata-only pass before the pass
    that saves: a stateful model (BatchNorm statistics, counters) then runs only once in effect.

    A lazy module's buffer (``nn.LazyBatchNorm1d``) has no value until the module's first call
    creates it; its value is taken right then, before the module's forward can update it.
    """

    def __init__(self, model: nn.Module) -> None:
        self.dicts = [(m, dict(m._buffers)) for m in model.modules()]
        self.values = [
            (b, b.detach().clone()) for _, bs in self.dicts for b in bs.values() if b is not None and not is_lazy(b)
        ]
        self.handles = []
        for module, buffers in self.dicts:
            lazy = [b for b in buffers.values() if b is not None and is_lazy(b)]
            if lazy:
                # appended after the module's own initialising hook (registered when it was built)
                self.handles.append(module.register_forward_pre_hook(self._created(lazy)))

    def _created(self, lazy: List[Any]) -> Callable[[nn.Module, Any], None]:
        def take_values(module: nn.Module, args: Any) -> None:
            if not any(is_lazy(b) for b in lazy):
                with torch.no_grad():
                    self.values.extend((b, b.clone()) for b in lazy)
                lazy.clear()

        return take_values

    def restore(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        for module, buffers in self.dicts:
            held = module._buffers
            if isinstance(held, dict):
                held.clear()
                held.update(buffers)
            else:  # a TorchScript module's view of its buffers: fixed names, set one by one
                for name, buffer in buffers.items():
                    if held[name] is not buffer:
                        held[name] = buffer
        with torch.no_grad():
            for buffer, value in self.values:
                buffer.copy_(value)
