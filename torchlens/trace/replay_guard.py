"""What a replayed operation may do: produce what its record declares, and nothing else.

``replay.replay_entry`` runs a saved function on saved arguments, and a loaded history's
functions and arguments come from a file someone else wrote. ``ReplayGuard`` watches every
torch operator the call reaches (a ``TorchDispatchMode``, so the operators inside a composite
function are seen too) and, before each one runs:

* refuses operators whose only effect is outside the result: printing (``aten::_print``), a
  global cache, a stream; generally any operator that takes no tensor and returns nothing;
* predicts the bytes of its outputs (without allocating: from the operator's kind, or its
  meta-device kernel) and refuses it when they exceed the replay's budget, which follows from
  what the record declares (its output and the tensors passed in), not from a number in an
  argument;

and after each one, checks the invariants of every sparse tensor it made (indices inside the
size), so that an unchecked sparse constructor cannot hand a later kernel indices that write
out of bounds. Sparse tensors are also built with torch's own invariant checks switched on
(``torch.sparse.check_sparse_tensor_invariants``) while the guard is active.

Example:
    >>> import torch
    >>> with ReplayGuard(limit_bytes=1 << 20):
    ...     torch.ones(1 << 28)
    Traceback (most recent call last):
    ...
    torchlens.trace.replay_guard.ReplayRefusedError: aten.ones.default would make 1073741824 bytes, ...
"""

from __future__ import annotations

import math
from typing import Any, Dict, Hashable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..errors import TorchlensError

# operators whose effect is outside their result: never run by a replay
SIDE_EFFECT_OPERATORS = frozenset(
    {
        "_print",
        "print",
        "record_stream",
        "_cufft_set_plan_cache_max_size",
        "_cufft_clear_plan_cache",
        "_record_function_enter",
        "_record_function_enter_new",
        "_record_function_exit",
    }
)
HEADROOM = 64  # an operator inside a replay may make up to this many times what the record declares
FLOOR_BYTES = 64 << 20  # ...and at least this much (small layers still run composite kernels)
_CACHE_SIZE = 4096
_SPARSE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


class ReplayRefusedError(TorchlensError, RuntimeError):
    """A replayed operation was stopped before it ran: it would have had an effect outside its
    result, made more data than its record declares, or built an invalid sparse tensor.

    Example:
        >>> isinstance(ReplayRefusedError("x"), RuntimeError)
        True
    """


def operator_name(func: Any) -> str:
    """``'_print'`` for ``torch.ops.aten._print.default`` (the name without namespace or overload)."""
    packet = getattr(func, "_overloadpacket", func)
    qualified = str(getattr(packet, "_qualified_op_name", getattr(func, "__name__", "")))
    return qualified.rpartition("::")[2]


def side_effect_reason(func: Any) -> Optional[str]:
    """Why operator ``func`` has an effect outside its result (None when it has none known)."""
    try:
        return _SIDE_EFFECTS[func]
    except (KeyError, TypeError):  # TypeError: a function that cannot be a key
        pass
    reason = _side_effect_reason(func)
    try:
        _SIDE_EFFECTS[func] = reason
    except TypeError:
        pass
    return reason


_SIDE_EFFECTS: Dict[Any, Optional[str]] = {}  # operator -> its reason: the same every time it runs


def _side_effect_reason(func: Any) -> Optional[str]:
    if operator_name(func).rstrip("_") in SIDE_EFFECT_OPERATORS or operator_name(func) in SIDE_EFFECT_OPERATORS:
        return "has an effect outside its result (output, a global setting or a stream)"
    schema = getattr(func, "_schema", None)
    if schema is not None and not schema.returns and not any(_is_tensor_type(a.type) for a in schema.arguments):
        return "takes no tensor and returns nothing, so all it does is an effect outside its result"
    return None


def _is_tensor_type(kind: Any) -> bool:
    return "Tensor" in str(kind)


def nbytes_of(value: Any) -> int:
    """Bytes of the data behind a tensor (its parts for sparse and nested ones); 0 for others."""
    if not isinstance(value, torch.Tensor):
        return 0
    try:
        if value.is_nested:
            return sum(nbytes_of(t) for t in value.unbind())
        if value.layout == torch.sparse_coo:
            return nbytes_of(value._indices()) + nbytes_of(value._values())
        if value.layout in _SPARSE:
            return sum(t.numel() * t.element_size() for t in _compressed_parts(value))
        return value.numel() * value.element_size()
    except (RuntimeError, NotImplementedError):
        return 0


def dense_nbytes(value: torch.Tensor) -> int:
    """Bytes ``value`` would take as a dense tensor (a sparse tensor's logical size)."""
    return math.prod(value.shape) * value.element_size()


def _compressed_parts(value: torch.Tensor) -> List[torch.Tensor]:
    if value.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [value.crow_indices(), value.col_indices(), value.values()]
    return [value.ccol_indices(), value.row_indices(), value.values()]


def check_sparse(value: torch.Tensor) -> None:
    """Raise ``ReplayRefusedError`` unless sparse ``value``'s indices fit its size (read before
    any kernel that trusts them writes where they point)."""
    try:
        if value.layout == torch.sparse_coo:
            torch._validate_sparse_coo_tensor_args(value._indices(), value._values(), value.shape)
        elif value.layout in _SPARSE:
            compressed, plain, values = _compressed_parts(value)
            torch._validate_sparse_compressed_tensor_args(compressed, plain, values, value.shape, layout=value.layout)
    except RuntimeError as error:
        raise ReplayRefusedError(f"it built an invalid sparse tensor ({str(error)[:200]})") from None


class ReplayGuard(TorchDispatchMode):
    """Every operator run while the guard is active: side effects refused, output bytes
    predicted and bounded by ``limit_bytes``, sparse results checked (see the module docstring).

    Example:
        >>> import torch
        >>> with ReplayGuard(limit_bytes=1 << 20):
        ...     torch.relu(torch.ones(3)).tolist()
        [1.0, 1.0, 1.0]
    """

    def __init__(self, limit_bytes: int) -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        self._sparse_checks: Any = None

    def __enter__(self) -> "ReplayGuard":
        self._sparse_checks = torch.sparse.check_sparse_tensor_invariants(enable=True)
        self._sparse_checks.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._sparse_checks.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._sparse_checks.__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        reason = side_effect_reason(func)
        if reason is not None:
            raise ReplayRefusedError(f"{func} {reason}; a replay runs nothing of the kind")
        predicted = predict_nbytes(func, args, kwargs)
        if predicted is not None and predicted > self.limit_bytes:
            raise ReplayRefusedError(
                f"{func} would make {predicted} bytes, more than this replay may "
                f"({self.limit_bytes} bytes: {HEADROOM}x what its record declares, and at least {FLOOR_BYTES})"
            )
        out = func(*args, **kwargs)
        for value in (out,) if isinstance(out, torch.Tensor) else leaves_of((out,), {}):
            if isinstance(value, torch.Tensor) and value.layout in _SPARSE:
                check_sparse(value)
        return out


def replay_limit(declared_bytes: int) -> int:
    """The most one operator of a replay may make, for a record declaring ``declared_bytes``."""
    return max(FLOOR_BYTES, HEADROOM * declared_bytes)


# ----- predicting an operator's output bytes without running it ---------------------------------
_PREDICTED: Dict[Hashable, Optional[int]] = {}


def predict_nbytes(func: Any, args: Any, kwargs: Dict[str, Any]) -> Optional[int]:
    """An upper bound of the bytes operator ``func`` makes from these arguments, computed
    without allocating them; None when it cannot be told (no meta kernel: the call runs)."""
    if getattr(func, "is_view", False):
        return 0
    leaves = leaves_of(args, kwargs)
    tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
    tags = getattr(func, "tags", ())
    strided = all(t.layout == torch.strided and not t.is_nested for t in tensors)
    if strided and tensors and torch.Tag.pointwise in tags:
        shapes = {t.shape for t in tensors}
        try:
            shape = next(iter(shapes)) if len(shapes) == 1 else torch.broadcast_shapes(*shapes)
        except RuntimeError:
            return None  # the operator reports the mismatch itself
        return math.prod(shape) * max(8, *(t.element_size() for t in tensors))
    if strided and tensors and torch.Tag.reduction in tags:
        return max(t.numel() for t in tensors) * 8
    if torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags:
        return _data_dependent_nbytes(func, tensors)
    if not strided:  # no meta kernels for sparse and nested tensors: bounded by their dense size
        return (
            max(dense_nbytes(t) for t in tensors if t.layout != torch.strided and not t.is_nested)
            if any(t.layout != torch.strided and not t.is_nested for t in tensors)
            else None
        )
    return _meta_nbytes(func, args, kwargs, leaves)


def leaves_of(args: Any, kwargs: Dict[str, Any]) -> List[Any]:
    """The values inside an operator's arguments, in ``tree_flatten``'s order: lists, tuples
    (``torch.Size`` too) and dicts opened, anything else a leaf; a fraction of
    ``tree_flatten``'s time, which a replay pays at every operator.

    Example:
        >>> leaves_of((1, [2, (3,)]), {"a": 4})
        [1, 2, 3, 4]
    """
    found: List[Any] = []
    _open(args, found)
    _open(kwargs, found)
    return found


def _open(value: Any, found: List[Any]) -> None:
    if isinstance(value, (list, tuple)):  # torch.Size and named tuples too, as tree_flatten opens them
        for item in value:
            if isinstance(item, _CONTAINERS):
                _open(item, found)
            else:
                found.append(item)
    elif isinstance(value, dict):
        _open(list(value.values()), found)
    else:
        found.append(value)


_CONTAINERS = (list, tuple, dict)


def _data_dependent_nbytes(func: Any, tensors: List[torch.Tensor]) -> Optional[int]:
    """Outputs sized by values: ``repeat_interleave`` by the sum of its repeats, the others
    (``nonzero``, ``unique``, ``masked_select``...) by their input's elements."""
    if not tensors:
        return None
    if operator_name(func) == "repeat_interleave" and tensors[0].dtype in (torch.int32, torch.int64):
        total = int(tensors[0].to(torch.int64).clamp(min=0).sum()) if tensors[0].numel() else 0
        return total * 8
    return sum(max(1, t.dim()) * t.numel() * 8 for t in tensors if t.layout == torch.strided)


def _meta_nbytes(func: Any, args: Any, kwargs: Dict[str, Any], leaves: List[Any]) -> Optional[int]:
    key = _cache_key(func, leaves)
    if key is not None and key in _PREDICTED:
        return _PREDICTED[key]
    found = _run_on_meta(func, args, kwargs, any(isinstance(v, torch.Tensor) for v in leaves))
    if key is not None:
        if len(_PREDICTED) >= _CACHE_SIZE:
            _PREDICTED.clear()
        _PREDICTED[key] = found
    return found


def _run_on_meta(func: Any, args: Any, kwargs: Dict[str, Any], has_tensor: bool) -> Optional[int]:
    def to_meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="meta")
        if isinstance(value, torch.device):
            return torch.device("meta")
        return value

    meta_kwargs = tree_map(to_meta, kwargs)
    schema = getattr(func, "_schema", None)
    if not has_tensor:  # a factory: its sizes are what to check
        if schema is None or not any(a.name == "device" for a in schema.arguments):
            return None
        meta_kwargs["device"] = torch.device("meta")
    try:
        out = func(*tree_map(to_meta, args), **meta_kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel, or arguments the real kernel will reject itself
        return None
    return sum(
        v.untyped_storage().nbytes() if v.layout == torch.strided else dense_nbytes(v)
        for v in tree_flatten(out)[0]
        if isinstance(v, torch.Tensor)
    )


def _cache_key(func: Any, leaves: List[Any]) -> Optional[Tuple[Any, ...]]:
    parts: List[Any] = [func]
    for value in leaves:
        if isinstance(value, torch.Tensor):
            parts.append((tuple(value.shape), value.stride(), value.dtype))
        elif value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout)):
            parts.append((type(value), value))
        else:
            return None
    return tuple(parts)


__all__ = [
    "ReplayGuard",
    "ReplayRefusedError",
    "replay_limit",
    "predict_nbytes",
    "side_effect_reason",
    "nbytes_of",
    "check_sparse",
    "leaves_of",
]
