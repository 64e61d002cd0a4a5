"""The decorator layer: which torch callables get wrapped, and installing them for one pass.

The set of callables is derived from ``torch.overrides`` (everything torch lets a tensor subclass
intercept) plus the tensor factories that ``torch.overrides`` lists as ignored, plus the private
functions and ``Tensor`` methods that are aten operators (``torch._weight_norm``, the fused
``torch._transformer_encoder_layer_fwd`` that fast paths call), plus ``torch.sparse`` and
``torch.nested``. ``torch.ops`` operators and functorch transforms are wrapped in ``opaque.py``.
Wrappers are built once and cached, and built again when torch's namespaces no longer hold what
they were made for (``WrapperTable.is_current``). Installing or removing them writes namespace
dicts in one step each (``capture/class_dict.py`` for ``torch.Tensor``).

A wrapper does nothing but forward the call unless a pass is active *in the calling thread*; then
it hands the call to the active tracer (``capture.tracer.Tracer.on_call``).
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

import torch
import torch.overrides

from .class_dict import ClassDict, Namespace, has_own_slot, namespace_of
from .constructors import CONSTRUCTORS, call_slots
from .opaque import opaque_patches
from .ops import ACTIVE, ClassGroup, NamespaceGroup, OpInfo, Patch
from .ops import is_inplace_name as _is_inplace_name
from .ops import layer_type as _layer_type

_get_ident = threading.get_ident

# Tensor methods that never produce a tensor (or only act on autograd/storage bookkeeping).
# Wrapping them would only add overhead, and a few (``requires_grad_``) end in ``_`` without
# being computations.
_NOT_OPERATIONS = frozenset(
    """dim ndimension size stride numel nelement element_size is_contiguous is_floating_point
    is_complex is_signed is_inference is_nonzero is_same_size is_set_to is_shared is_pinned
    is_coalesced data_ptr storage_offset get_device item tolist numpy backward register_hook
    register_post_accumulate_grad_hook retain_grad requires_grad_ share_memory_ storage
    untyped_storage dim_order has_names equal __len__ __hash__ __repr__ __str__ __format__
    __iter__ __contains__ __reduce_ex__ __reduce__ __setstate__ __getstate__ __deepcopy__
    __copy__ __dir__ __init__ __new__ __init_subclass__ __subclasshook__ __torch_function__
    __torch_dispatch__ __array__ __array_wrap__ __dlpack__ __dlpack_device__ __getattribute__
    __setattr__ __delattr__ __sizeof__ __index__ __int__ __float__ __complex__ __long__
    __bool__ __nonzero__ __class__ __reversed__ __get__""".split()
)

# Functions torch.overrides lists as "ignored" are mostly not computations (grad-mode switches,
# seeds, serialization, compilation). Of those we keep the tensor factories: the names below
# and prefixes mark the ones that are not.
_IGNORED_NOT_FACTORIES = frozenset(
    """vmap compile cond export fork wait save load manual_seed seed initial_seed typename
    promote_types can_cast result_type broadcast_shapes no_grad enable_grad inference_mode
    set_grad_enabled autocast_increment_nesting autocast_decrement_nesting clear_autocast_cache
    init_num_threads parse_ir parse_schema parse_type_comment merge_type_from_type_comment
    import_ir_module import_ir_module_from_buffer unify_type_list register_dataclass
    handle_torch_function boolean_dispatch sym_constrain_range sym_constrain_range_for_size
    sym_fresh_size""".split()
)
_NOT_FACTORY_PREFIXES = ("_", "is_", "get_", "set_", "use_", "are_", "sym_")

# Properties that compute a tensor from a tensor.
_TENSOR_PROPERTIES = ("T", "H", "mT", "mH", "real", "imag", "data")


def _make_wrapper(orig: Callable[..., Any], info: OpInfo) -> Callable[..., Any]:
    def torchlens_wrapper(*args: Any, **kwargs: Any) -> Any:
        tracer = ACTIVE.tracer
        if tracer is None or tracer.paused or tracer.thread_id != _get_ident():
            return orig(*args, **kwargs)
        return tracer.on_call(orig, info, args, kwargs)

    torchlens_wrapper.__name__ = getattr(orig, "__name__", info.name)
    torchlens_wrapper.__qualname__ = getattr(orig, "__qualname__", info.name)
    torchlens_wrapper.__doc__ = getattr(orig, "__doc__", None)
    torchlens_wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    return torchlens_wrapper


def _make_bool_observer(orig: Callable[[torch.Tensor], bool]) -> Callable[[torch.Tensor], bool]:
    """``Tensor.__bool__``: not an operation, but the moment a tensor steers Python control flow
    (``if x.mean() > 0:``). The tracer notes it; the conversion itself is unchanged."""

    def torchlens_bool(tensor: torch.Tensor) -> bool:
        tracer = ACTIVE.tracer
        if tracer is not None and not tracer.paused and tracer.thread_id == _get_ident():
            tracer.on_bool(tensor)
        return orig(tensor)

    torchlens_bool.__wrapped__ = orig  # type: ignore[attr-defined]
    return torchlens_bool


def _property_getter(descriptor: Any) -> Callable[[torch.Tensor], Any]:
    def get(tensor: torch.Tensor) -> Any:
        return descriptor.__get__(tensor, type(tensor))

    return get


def _namespaces() -> List[Tuple[Any, List[str]]]:
    """(object to patch, attribute names to consider) for every place torch exposes functions."""
    import torch.nn.functional as F

    spaces: List[Tuple[Any, List[str]]] = []
    for ns in (torch, torch.functional, F, torch.linalg, torch.fft, torch.special):
        spaces.append((ns, list(vars(ns))))
    for name in ("_nn",):  # F.* Python functions call these directly
        sub = getattr(torch._C, name, None)
        if sub is not None:
            spaces.append((sub, list(vars(sub))))
    return spaces


def _whole_namespaces() -> List[Any]:
    """Namespaces whose every public function is an operation (torch.overrides lists none of
    them): ``torch.sparse.mm``, ``torch.nested.nested_tensor``, ``torch.nested.to_padded_tensor``."""
    import torch.nested
    import torch.sparse

    return [torch.sparse, torch.nested]


_NAMESPACE_HELPERS = frozenset({"as_sparse_gradcheck"})  # returns a function, not a tensor


def aten_operator_names() -> FrozenSet[str]:
    """Names of the aten operators (``'_weight_norm'``, ``'add'``): a private torch function or
    ``Tensor`` method of one of these names is a computation, not a utility of torch's own."""
    return frozenset(
        name.split("::", 1)[1].split(".", 1)[0]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::")
    )


def _is_private_operator(name: str, orig: object, aten: FrozenSet[str]) -> bool:
    return (
        name.startswith("_") and not name.startswith("__") and name in aten and type(orig) is types.BuiltinFunctionType
    )


def _wanted_functions() -> Dict[int, Tuple[Any, str]]:
    """id -> (function, recorded name) of the callables ``torch.overrides`` lists that compute:
    the overridable ones (not utilities) and the ignored ones that are tensor factories."""
    wanted: Dict[int, Tuple[Any, str]] = {}
    for funcs in torch.overrides.get_overridable_functions().values():
        for f in funcs:
            name = getattr(f, "__name__", None)
            if (
                name
                and name not in _NOT_OPERATIONS
                and not name.startswith("sym_")
                and not (name.startswith("_") and not name.startswith("__"))
            ):
                wanted[id(f)] = (f, name)
    for f in torch.overrides.get_ignored_functions():
        name = getattr(f, "__name__", None)
        if (
            name
            and not isinstance(f, type)
            and name not in _IGNORED_NOT_FACTORIES
            and name not in _NOT_OPERATIONS
            and not name.startswith(_NOT_FACTORY_PREFIXES)
        ):
            wanted[id(f)] = (f, name)
    return wanted


class _WrappedVariableFunctions:
    """Stands in for ``torch._C._VariableFunctions`` behind ``torch._VF`` during a pass.

    ``torch._VF`` (used by ``nn.LSTM``, ``F.dropout``, ``torch.functional``) looks its functions
    up on its ``vf`` attribute at every call; swapping that one attribute routes all of them
    through the wrappers, instead of shadowing hundreds of names one by one.
    """

    def __init__(self, real: object, by_original: Dict[int, Callable[..., Any]]) -> None:
        self._real = real
        self._by_original = by_original

    def __getattr__(self, name: str) -> Any:
        original = getattr(self._real, name)
        return self._by_original.get(id(original), original)


class WrapperTable:
    """All wrappers for torch as it is: ``patches`` to install, and original->wrapper."""

    def __init__(self, previous: Optional["WrapperTable"] = None) -> None:
        self.by_original: Dict[int, Callable[..., Any]] = {}
        self.originals: Dict[int, Any] = {}  # id -> original, keeps ids stable
        self.patches: List[Patch] = []
        self._build()
        # calls of torch.Tensor, torch.FloatTensor...: their metaclasses' call slots; the
        # functions recorded for them count as wrapped originals (a loaded history may call them)
        self.call_slots = call_slots()
        self.originals.update((id(f), f) for f in CONSTRUCTORS.values())
        # Patches are written one namespace at a time, in C: a module's dict, or a class's real
        # dict (capture/class_dict.py; a Python loop of 1,900 writes cost more than a small
        # model's forward). Only methods a C slot calls directly need setattr (type_patches).
        # Groups: (namespace, name -> wrapper, name -> original, names shadowed then removed).
        by_namespace: Dict[int, Tuple[Any, Namespace, Namespace, List[str]]] = {}
        self.type_patches: List[Patch] = []
        for p in self.patches:
            if isinstance(p.owner, types.ModuleType):
                namespace: Any = vars(p.owner)
            else:
                namespace = None if has_own_slot(p.original) else ClassDict.of(p.owner)
                if namespace is None:
                    self.type_patches.append(p)
                    continue
            group = by_namespace.setdefault(id(p.owner), (namespace, {}, {}, []))
            group[1][p.name] = p.replacement
            if p.had_own:
                group[2][p.name] = p.original
            else:
                group[3].append(p.name)
        groups = list(by_namespace.values())
        self.namespace_groups: List[NamespaceGroup] = [g for g in groups if isinstance(g[0], dict)]
        self.class_groups: List[ClassGroup] = [g for g in groups if isinstance(g[0], ClassDict)]
        # (see is_current) what each namespace must still hold, and names an earlier table
        # wrapped that this one leaves alone (a mock was there): (namespace, name, value then)
        self.expected = [(d, originals, frozenset(shadowed)) for d, _, originals, shadowed in self.namespace_groups]
        self.expected += [
            (c.namespace, originals, frozenset(shadowed)) for c, _, originals, shadowed in self.class_groups
        ]
        self.watched: List[Tuple[Namespace, str, Any]] = []
        if previous is not None:
            patched = {(id(namespace_of(p.owner)), p.name) for p in self.patches}
            earlier = [(namespace_of(p.owner), p.name) for p in previous.patches]
            earlier += [(namespace, name) for namespace, name, _ in previous.watched]
            for namespace, name in earlier:
                if (id(namespace), name) not in patched:
                    patched.add((id(namespace), name))
                    self.watched.append((namespace, name, namespace.get(name, _ABSENT)))

    def is_current(self) -> bool:
        """Whether torch still holds what the wrappers were made for. A function may have been
        replaced since (``unittest.mock.patch('torch.relu')``, another library's patch):
        installing these wrappers would hide it, and uninstalling would put back the old one.
        A mock that wrappers were built around may have gone again, leaving its name unwrapped.
        Both compared in C (about 35 us); a change means new wrappers (about 16 ms)."""
        for namespace, originals, shadowed in self.expected:
            if not originals.items() <= namespace.items() or not namespace.keys().isdisjoint(shadowed):
                return False
        for namespace, name, value in self.watched:
            if namespace.get(name, _ABSENT) is not value:
                return False
        for p in self.type_patches:
            own = vars(p.owner)
            if (own.get(p.name) is not p.original) if p.had_own else (p.name in own):
                return False
        return True

    def _build(self) -> None:
        wanted = _wanted_functions()
        aten = aten_operator_names()
        self._add_namespaces(wanted, aten)
        self._add_tensor_methods(wanted, aten)
        self._add_special_patches()

    def _add_namespaces(self, wanted: Dict[int, Tuple[Any, str]], aten: FrozenSet[str]) -> None:
        """The functions of torch's namespaces (``torch``, ``F``, ``torch.linalg``, ...)."""
        for owner, names in _namespaces():
            own = vars(owner)
            for name in names:
                orig = own.get(name) if name in own else getattr(owner, name, None)
                if orig is None or isinstance(orig, type):
                    continue
                if id(orig) in wanted:
                    self._add(owner, name, orig, wanted[id(orig)][1], had_own=name in own)
                elif _is_inplace_variant(owner, name, orig, wanted):
                    self._add(owner, name, orig, name, had_own=name in own)
                elif _is_private_operator(name, orig, aten):
                    # reached by fast paths (torch._native_multi_head_attention), parametrizations
                    # (torch._weight_norm), torch._VF (_pack_padded_sequence), F.interpolate
                    self._add(owner, name, orig, name, had_own=name in own)
        for owner in _whole_namespaces():
            for name, orig in list(vars(owner).items()):
                if (
                    name.startswith("_")
                    or name in _NAMESPACE_HELPERS
                    or isinstance(orig, type)
                    or type(orig) not in FUNCTION_TYPES
                ):
                    continue
                # the function's own name: torch.sparse.mm is "_sparse_mm", not torch.mm's "mm"
                self._add(owner, name, orig, getattr(orig, "__name__", name), had_own=True)

    def _add_tensor_methods(self, wanted: Dict[int, Tuple[Any, str]], aten: FrozenSet[str]) -> None:
        """The methods of ``torch.Tensor`` that compute (``x.add``, ``x.new_zeros``, ``x._values``)."""
        tensor_dict = vars(torch.Tensor)
        for name in dir(torch.Tensor):
            if name in _NOT_OPERATIONS or name in _TENSOR_PROPERTIES:
                continue
            private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            if private and name not in aten:
                continue
            orig = getattr(torch.Tensor, name, None)
            if orig is None or isinstance(orig, (property, type)) or not callable(orig):
                continue
            if type(orig).__name__ == "getset_descriptor":
                continue
            key = id(orig)
            # private aten methods: x._values(), x._indices() of sparse tensors, x._conj()
            if key not in wanted and not name.startswith("new_") and not private:
                continue
            self._add(torch.Tensor, name, orig, name, had_own=name in tensor_dict)

    def _add_special_patches(self) -> None:
        """``torch._VF``, ``torch.ops`` and the functorch transforms, ``Tensor.__bool__`` and the
        tensor properties that compute (``x.T``, ``x.real``)."""
        tensor_dict = vars(torch.Tensor)
        vf_module = sys.modules.get("torch._VF")
        if vf_module is not None and "vf" in vars(vf_module):
            real = vars(vf_module)["vf"]
            self.patches.append(
                Patch(vf_module, "vf", _WrappedVariableFunctions(real, self.by_original), real, had_own=True)
            )
        self.patches.extend(opaque_patches())
        bool_orig = torch.Tensor.__bool__
        self.patches.append(
            Patch(
                torch.Tensor, "__bool__", _make_bool_observer(bool_orig), bool_orig, had_own="__bool__" in tensor_dict
            )
        )
        for name in _TENSOR_PROPERTIES:
            desc = getattr(torch.Tensor, name, None) if name not in tensor_dict else tensor_dict[name]
            if desc is None:
                continue
            info = OpInfo(name, _layer_type(name), False, is_property=True)
            getter = _make_wrapper(_property_getter(desc), info)
            setter = (lambda t, v, d=desc: d.__set__(t, v)) if hasattr(desc, "__set__") else None
            self.patches.append(Patch(torch.Tensor, name, property(getter, setter), desc, had_own=name in tensor_dict))

    def _add(self, owner: Any, name: str, orig: Any, func_name: str, had_own: bool) -> None:
        key = id(orig)
        wrapper = self.by_original.get(key)
        if wrapper is None:
            info = OpInfo(
                func_name, _layer_type(func_name), _is_inplace_name(func_name), inplace_arg=_inplace_parameter(orig)
            )
            wrapper = _make_wrapper(orig, info)
            self.by_original[key] = wrapper
            self.originals[key] = orig
        self.patches.append(Patch(owner, name, wrapper, orig, had_own=had_own))


def _inplace_parameter(func: object) -> int:
    """The position of a Python function's ``inplace`` parameter, or -1."""
    code: Optional[types.CodeType] = getattr(func, "__code__", None)
    if code is None or "inplace" not in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]:
        return -1
    return code.co_varnames.index("inplace")


def writes_in_place(info: OpInfo, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether this call writes into its first argument."""
    if info.is_inplace:
        return True
    if info.inplace_arg < 0:
        return False
    if kwargs and "inplace" in kwargs:
        return bool(kwargs["inplace"])
    return len(args) > info.inplace_arg and bool(args[info.inplace_arg])


def _is_inplace_variant(owner: Any, name: str, orig: Any, wanted: Dict[int, Any]) -> bool:
    """``torch.relu_``, ``F.leaky_relu_``: in-place twins that ``torch.overrides`` leaves out."""
    if not name.endswith("_") or name.startswith("_") or not callable(orig):
        return False
    twin = getattr(owner, name[:-1], None)
    return (twin is not None and id(twin) in wanted) or hasattr(torch.Tensor, name)


_TABLE: Optional[WrapperTable] = None


def wrapper_table() -> WrapperTable:
    """The wrappers of the process (those installed, during a pass)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = WrapperTable()
    return _TABLE


_ABSENT = object()


def current_wrapper_table() -> WrapperTable:
    """The wrappers for torch as it is now, to install for a pass: rebuilt when a torch
    callable was replaced since they were made; the table in place, while one is held from pass
    to pass (``run.HeldWrappers``). Only outside a pass."""
    global _TABLE
    installed = ACTIVE.installed
    if isinstance(installed, WrapperTable):  # the only kind of table installed
        return installed
    table = wrapper_table()
    if not table.is_current():
        _TABLE = table = WrapperTable(previous=table)
    return table


FUNCTION_TYPES = (types.BuiltinFunctionType, types.FunctionType)
