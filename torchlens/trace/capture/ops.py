"""What every wrapper shares: the description of a wrapped callable (``OpInfo``), the tracer of
the pass in progress (``ACTIVE``), and putting a table of patches in place and back.

``decorate.py`` decides which callables are wrapped; ``opaque.py`` wraps the ones the tracer sees
as one node. Both build on this module, which imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from .class_dict import ClassDict, Namespace

# Reflected operators compute the same function as their plain form.
_REFLECTED = frozenset("add sub mul matmul truediv div floordiv pow mod and or xor lshift rshift".split())


# Functions whose result depends on the random number generator (replayed with its state);
# scaled_dot_product_attention draws its attention dropout (dropout_p > 0 in training).
_RANDOM_FUNCS = frozenset(
    """rand randn randint rand_like randn_like randint_like randperm bernoulli bernoulli_
    multinomial normal normal_ poisson uniform_ exponential_ geometric_ cauchy_ log_normal_
    random_ rrelu rrelu_ rrelu_with_noise scaled_dot_product_attention
    vmap grad grad_and_value vjp jvp vjp_fn""".split()  # transforms run arbitrary code
)


@dataclass(frozen=True)
class OpInfo:
    """What the tracer needs to know about a wrapped callable, computed once."""

    name: str  # e.g. "conv2d", "__add__", "relu_"
    layer_type: str  # lower-cased, without underscores: "conv2d", "add", "relu"
    is_inplace: bool  # mutates its first argument
    is_property: bool = False
    # one node whatever runs inside: the tracer is paused during the call (torch.ops operators,
    # functorch transforms, whose insides run on wrapped tensors or below the dispatcher)
    opaque: bool = False
    # position of an ``inplace`` parameter (``F.silu(x, inplace=True)`` writes into ``x`` through
    # a binding torchlens does not wrap); -1: none
    inplace_arg: int = -1
    # writes into an argument (in place, or through ``inplace``): told once, read at every call
    may_write: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "may_write", self.is_inplace or self.inplace_arg >= 0)

    @property
    def is_random(self) -> bool:
        return self.name in _RANDOM_FUNCS or "dropout" in self.name


def layer_type(name: str) -> str:
    core = name
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        if core[:1] == "r" and core[1:] in _REFLECTED:
            core = core[1:]
    return core.replace("_", "").lower()


def is_inplace_name(name: str) -> bool:
    if name.startswith("__"):
        return name == "__setitem__" or (name[2:3] == "i" and name[3:-2] in _REFLECTED)
    return name.endswith("_")


class ActiveTracer(Protocol):
    """What the wrappers read of the tracer of the pass in progress (``capture/tracer.Tracer``)."""

    paused: bool  # calls made while True run unlogged (the tracer's own work, torch's kernels)
    thread_id: int  # only the calls of the thread that runs the pass are logged

    def on_call(
        self, func: Callable[..., Any], info: OpInfo, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Any: ...  # what ``func`` returned (the user's values)

    def on_bool(self, tensor: torch.Tensor) -> None: ...


@dataclass
class Patch:
    owner: Any  # a module, a class or an object of torch's: whatever holds the attribute
    name: str
    replacement: Any
    original: Any  # what ``getattr`` gave before
    had_own: bool  # whether the name was in ``owner.__dict__`` (else we shadow and delete)


class CallPatch(Protocol):
    """A patch of a metaclass's call slot (``class_dict.CallSlot``)."""

    def install(self) -> None: ...

    def uninstall(self) -> None: ...


# (namespace, name -> wrapper, name -> original, names shadowed then removed)
NamespaceGroup = Tuple[Namespace, Namespace, Namespace, List[str]]
ClassGroup = Tuple[ClassDict, Namespace, Namespace, List[str]]


class PatchTable(Protocol):
    """What installing reads of a table of wrappers (``decorate.WrapperTable``)."""

    @property
    def namespace_groups(self) -> Sequence[NamespaceGroup]: ...

    @property
    def class_groups(self) -> Sequence[ClassGroup]: ...

    @property
    def type_patches(self) -> Sequence[Patch]: ...

    @property
    def call_slots(self) -> Sequence[CallPatch]: ...


class _Active:
    """The tracer of the pass in progress (``None`` outside a pass). One per process."""

    tracer: Optional[ActiveTracer] = None
    installed: Optional[PatchTable] = None  # the wrapper table in place, if any
    # how many installs of it are not undone yet: a pass inside wrappers held from pass to pass
    # (capture/run.py's HeldWrappers) installs and uninstalls without writing anything
    holders = 0


ACTIVE = _Active()


def install(table: PatchTable) -> None:
    """Put every wrapper of ``table`` (a ``decorate.WrapperTable``) in place. Must be paired with
    ``uninstall``; installed already, only counted."""
    if ACTIVE.installed is table:
        ACTIVE.holders += 1
        return
    ACTIVE.installed, ACTIVE.holders = table, 1
    for owner_dict, replacements, _, _ in table.namespace_groups:
        owner_dict.update(replacements)
    for class_dict, replacements, _, _ in table.class_groups:
        class_dict.update(replacements)
    for p in table.type_patches:
        setattr(p.owner, p.name, p.replacement)
    for slot in table.call_slots:  # calls of tensor classes (capture/constructors.py)
        slot.install()


def uninstall(table: PatchTable) -> None:
    """Restore every patched attribute to the exact original object (never raises half-way),
    when the last install of ``table`` is undone."""
    if ACTIVE.installed is table and ACTIVE.holders > 1:
        ACTIVE.holders -= 1
        return
    ACTIVE.installed, ACTIVE.holders = None, 0
    for slot in table.call_slots:
        slot.uninstall()
    for owner_dict, _, originals, shadowed in table.namespace_groups:
        owner_dict.update(originals)
        for name in shadowed:
            owner_dict.pop(name, None)
    for class_dict, replacements, originals, shadowed in table.class_groups:
        class_dict.restore(originals, shadowed, replacements)
    failed = []
    for p in table.type_patches:
        try:
            if p.had_own:
                setattr(p.owner, p.name, p.original)
            else:
                delattr(p.owner, p.name)
        except AttributeError:
            pass  # already gone: nothing of ours to remove
        except Exception as error:  # pragma: no cover - restoring must go on for the others
            failed.append(f"{p.name}: {error}")
    if failed:  # pragma: no cover
        raise RuntimeError("torchlens could not restore some torch attributes: " + "; ".join(failed))


def set_aside(table: PatchTable) -> int:
    """Restore torch while ``table`` is installed, however many times; ``put_back`` undoes it."""
    holders = ACTIVE.holders if ACTIVE.installed is table else 0
    if holders:
        ACTIVE.holders = 1
        uninstall(table)
    return holders


def put_back(table: PatchTable, holders: int) -> None:
    """Install ``table`` again as ``set_aside`` found it."""
    for _ in range(holders):
        install(table)


__all__ = [
    "OpInfo",
    "ACTIVE",
    "ActiveTracer",
    "CallPatch",
    "Patch",
    "PatchTable",
    "install",
    "uninstall",
    "set_aside",
    "put_back",
    "layer_type",
    "is_inplace_name",
]
