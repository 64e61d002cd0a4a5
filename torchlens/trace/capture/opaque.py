"""Callables logged as one node whatever runs inside them: ``torch.ops`` operators and functorch
transforms.

* ``torch.ops.<namespace>.<op>`` (``aten``, ``torchvision``'s ``roi_align``/``nms``, operators
  registered with ``torch.library``): every call goes through ``OpOverloadPacket.__call__`` or
  ``OpOverload.__call__``, so wrapping those two methods covers every namespace, including ones
  registered after torchlens was imported. An operator is what its author declared to be one
  unit, and its implementation runs below the dispatcher (a C++/CUDA kernel, or a Python kernel
  called with autograd already handled), so it is one node.
* functorch transforms (``torch.vmap``, ``torch.func.grad``, ``vjp``, ``jvp``, and through them
  ``jacrev``, ``jacfwd``, ``hessian``): the function inside runs on batched or grad-tracking
  wrapper tensors that must not escape the transform, so the call is one node. The entry points
  wrapped are the ones every transformed function calls at call time (``vmap_impl``,
  ``grad_impl``, ...), so functions transformed before the pass (``self.f = torch.vmap(g)``)
  are covered too.

The tracer is paused while an opaque call runs (``OpInfo.opaque``); the recorded ``func`` is a
callable that replays the call from its tensor arguments.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, Dict, List, Tuple

import torch

from .ops import ACTIVE, OpInfo, Patch, put_back, set_aside
from .ops import is_inplace_name as _is_inplace_name
from .ops import layer_type as _layer_type

_get_ident = threading.get_ident


def operator_info(op: object) -> OpInfo:
    """``torch.ops.aten.add_.Tensor`` -> name ``add_`` (in place), layer type ``add``."""
    packet = getattr(op, "_overloadpacket", op)  # an overload's packet, or the packet itself
    name = getattr(packet, "__name__", None) or str(op)
    return OpInfo(name, _layer_type(name), _is_inplace_name(name), opaque=True)


def _operator_call_wrapper(orig_call: Callable[..., Any]) -> Callable[..., Any]:
    infos: Dict[int, Tuple[object, OpInfo]] = {}  # id(op) -> (op, info); ops live as long as torch

    def torchlens_operator_call(op: Any, /, *args: Any, **kwargs: Any) -> Any:
        tracer = ACTIVE.tracer
        if tracer is None or tracer.paused or tracer.thread_id != _get_ident():
            return orig_call(op, *args, **kwargs)
        found = infos.get(id(op))
        if found is None or found[0] is not op:
            found = infos[id(op)] = (op, operator_info(op))
        # op(*args) comes back here paused (opaque), and runs the original call
        return tracer.on_call(op, found[1], args, kwargs)

    torchlens_operator_call.__wrapped__ = orig_call  # type: ignore[attr-defined]
    return torchlens_operator_call


class TransformCall:
    """A functorch entry point bound to its non-tensor leading arguments: calling it with the
    call's own arguments runs (and, in validation, replays) the transform."""

    __slots__ = ("impl", "head", "keywords", "packed")

    def __init__(self, impl: Callable[..., Any], head: Tuple[Any, ...], keywords: Dict[str, Any], packed: bool) -> None:
        self.impl, self.head, self.keywords, self.packed = impl, head, keywords, packed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.packed:  # grad_impl(func, argnums, has_aux, args, kwargs)
            return self.impl(*self.head, args, kwargs)
        return self.impl(*self.head, *args, **self.keywords, **kwargs)

    def __repr__(self) -> str:
        inner = getattr(self.head[0], "__qualname__", repr(self.head[0])) if self.head else "?"
        return f"<{getattr(self.impl, '__name__', 'transform')} of {inner}>"


# entry point -> (node name, how many leading arguments are not data, keyword arguments that
# are not data, whether args/kwargs arrive packed as two arguments)
_TRANSFORMS: Dict[Tuple[str, str], Tuple[str, int, Tuple[str, ...], bool]] = {
    ("torch._functorch.apis", "vmap_impl"): ("vmap", 5, (), False),
    ("torch._functorch.eager_transforms", "grad_impl"): ("grad", 3, (), True),
    ("torch._functorch.eager_transforms", "grad_and_value_impl"): ("grad_and_value", 3, (), True),
    ("torch._functorch.eager_transforms", "_vjp_with_argnums"): ("vjp", 1, ("argnums", "has_aux"), False),
    ("torch._functorch.eager_transforms", "_jvp_with_argnums"): ("jvp", 1, ("argnums", "strict", "has_aux"), False),
}
TRANSFORM_NAMES = frozenset(name for name, _, _, _ in _TRANSFORMS.values()) | {"vjp_fn"}


def _transform_wrapper(
    orig: Callable[..., Any], info: OpInfo, head_count: int, keyword_names: Tuple[str, ...], packed: bool
) -> Callable[..., Any]:
    def torchlens_transform(*args: Any, **kwargs: Any) -> Any:
        tracer = ACTIVE.tracer
        if tracer is None or tracer.paused or tracer.thread_id != _get_ident():
            return orig(*args, **kwargs)
        if info.name == "jvp":
            _load_jvp_decompositions()
        keywords = {k: kwargs.pop(k) for k in keyword_names if k in kwargs}
        call = TransformCall(orig, args[:head_count], keywords, packed)
        if packed:
            args, kwargs = tuple(args[head_count]), dict(args[head_count + 1])
        else:
            args = args[head_count:]
        out = tracer.on_call(call, info, args, kwargs)
        if info.name == "vjp" and isinstance(out, tuple) and len(out) > 1 and callable(out[1]):
            # the vjp function computes tensors later: each of its calls is a node too
            out = (out[0], _opaque_function(out[1], _VJP_FN)) + out[2:]
        return out

    torchlens_transform.__wrapped__ = orig  # type: ignore[attr-defined]
    return torchlens_transform


def _load_jvp_decompositions() -> None:
    """Forward AD compiles torch's jvp decompositions with TorchScript on its first use in a
    process; TorchScript cannot read our wrappers, so that first use runs with torch's own
    functions in place (nothing is logged meanwhile)."""
    if "torch._decomp.decompositions_for_jvp" in sys.modules:
        return
    from torch.autograd import forward_ad

    table = ACTIVE.installed
    if table is None:
        forward_ad._maybe_load_decompositions()
        return
    holders = set_aside(table)  # all of them: wrappers held from pass to pass too
    try:
        forward_ad._maybe_load_decompositions()
    finally:
        put_back(table, holders)


_VJP_FN = OpInfo("vjp_fn", "vjpfn", False, opaque=True)


def _opaque_function(function: Callable[..., Any], info: OpInfo) -> Callable[..., Any]:
    @functools.wraps(function)
    def torchlens_opaque_function(*args: Any, **kwargs: Any) -> Any:
        tracer = ACTIVE.tracer
        if tracer is None or tracer.paused or tracer.thread_id != _get_ident():
            return function(*args, **kwargs)
        return tracer.on_call(function, info, args, kwargs)

    return torchlens_opaque_function


def opaque_patches() -> List[Patch]:
    """The patches for ``torch.ops`` and the functorch entry points that exist in this torch."""
    import importlib

    patches: List[Patch] = []
    for cls in (torch._ops.OpOverloadPacket, torch._ops.OpOverload):
        orig = vars(cls)["__call__"]
        patches.append(Patch(cls, "__call__", _operator_call_wrapper(orig), orig, had_own=True))
    for (module_name, attribute), (name, head, keywords, packed) in _TRANSFORMS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # pragma: no cover - an older torch without functorch
            continue
        orig = vars(module).get(attribute)
        if orig is None:  # pragma: no cover - renamed in another torch version
            continue
        info = OpInfo(name, _layer_type(name), False, opaque=True)
        patches.append(
            Patch(module, attribute, _transform_wrapper(orig, info, head, keywords, packed=packed), orig, had_own=True)
        )
    return patches


# Frames of these wrappers are not part of any func_call_stack.
WRAPPER_CODES = (
    _operator_call_wrapper(lambda op: None).__code__,
    _transform_wrapper(lambda: None, _VJP_FN, 0, (), packed=False).__code__,
    _opaque_function(lambda: None, _VJP_FN).__code__,
)

__all__ = ["opaque_patches", "operator_info", "TransformCall", "TRANSFORM_NAMES", "WRAPPER_CODES"]
