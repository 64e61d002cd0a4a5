"""Weights-free tracing: passes on the ``meta`` device, and passes whose operations torchlens
could not see.

A model built under ``with torch.device("meta")`` has parameters with a shape and a dtype but no
memory; its forward pass computes the shape and dtype of every result without values. The
history of such a pass is complete except for values (``activation`` is a meta tensor), so a
model too big for this machine can be inspected. What needs values refuses with a
``MetaDeviceError``: validation, ``rerun``, and a model whose control flow reads its tensors'
values (``if x.sum() > 0``, ``.item()``, ``nonzero``, ``tolist``).

``log_forward_pass(model, x, device="meta")`` runs the pass of a model with real weights on
meta copies of its parameters and buffers (``MetaCopies``): no memory is copied, and the model's
own parameter objects are put back afterwards, untouched.
"""

from __future__ import annotations

import linecache
import os
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn

from ...arguments import ArgumentValueError
from ..records.meta import META_NOTE, MetaDeviceError, is_meta_history, refuse_meta
from ..records.tensor_log import TensorLogEntry
from .args import tensors_in_call

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TORCHLENS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
# what torch says when a meta tensor is asked for its values
_NO_VALUES = ("meta tensor", "no data", "data-dependent", "register_meta", "meta device", "on meta")


def is_meta_pass(model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether any parameter, buffer or input tensor of the pass is on the meta device."""
    for tensor in _model_tensors(model):
        if tensor.is_meta:
            return True
    return any(t.is_meta for _, t in tensors_in_call(args, kwargs))


def _model_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    for module in model.modules():
        yield from (p for p in module._parameters.values() if p is not None)
        yield from (b for b in module._buffers.values() if b is not None)


def meta_note(model: nn.Module) -> str:
    n = sum(1 for _ in _model_tensors(model))
    return (
        f"{META_NOTE}: every operation, shape and dtype is recorded, but activations are meta tensors without "
        f"values ({n} parameters and buffers). Validation, rerun and comparisons need a real pass."
    )


# ----- data-dependent control flow ---------------------------------------------------------------
def is_value_error(error: BaseException) -> bool:
    """Whether ``error`` is torch saying that a meta tensor has no values."""
    text = str(error)
    return isinstance(error, (RuntimeError, NotImplementedError)) and any(s in text for s in _NO_VALUES)


def data_dependent_error(error: BaseException, op_context: Optional[str]) -> MetaDeviceError:
    """A ``MetaDeviceError`` naming the operation and the model's line that needed values."""
    site = _model_site(error)
    where = f" at {site[0]}:{site[1]} in {site[2]}()" if site else ""
    code = f": `{site[3]}`" if site and site[3] else ""
    op = _op_named(str(error)) or (op_context or "an operation")
    first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return MetaDeviceError(
        f"The model's forward needs tensor values{where}{code} ({op}), and the pass runs on the meta device, "
        "which has shapes and dtypes but no values, so control flow that reads a tensor (if x.sum() > 0, "
        ".item(), nonzero, tolist) cannot run. Trace with a small real input and real weights instead (e.g. "
        f"the same config with fewer layers, built without torch.device('meta')). torch said: {first_line}"
    )


def _op_named(text: str) -> Optional[str]:
    names = {
        "item()": ".item(), or a tensor used as a Python bool (an if on a comparison)",
        "nonzero": "nonzero",
        "copy out": "a copy of the values: tolist, numpy or cpu",
        "masked_select": "masked_select",
    }
    return next((said for known, said in names.items() if known in text), None)


def _model_site(error: BaseException) -> Optional[Tuple[str, int, str, str]]:
    """The innermost frame of the traceback in the model's code (neither torch nor torchlens)."""
    site = None
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        name = code.co_filename
        if not name.startswith((_TORCH_DIR, _TORCHLENS_DIR)) and not name.startswith("<"):
            site = (name, tb.tb_lineno, code.co_name, linecache.getline(name, tb.tb_lineno).strip())
        tb = tb.tb_next
    return site


# ----- device="meta" for a model with real weights ---------------------------------------------------
class MetaCopies:
    """While entered, every parameter and buffer of ``model`` is replaced by a meta tensor of
    the same shape, dtype and ``requires_grad`` (tied ones by one copy); on exit the original
    objects are put back exactly. Nothing is copied: meta tensors hold no memory.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(4, 3)
        >>> weight = model.weight
        >>> with MetaCopies(model):
        ...     model.weight.is_meta
        True
        >>> model.weight is weight
        True
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.saved: List[Tuple[Dict[str, Any], str, Any]] = []

    def __enter__(self) -> "MetaCopies":
        copies: Dict[int, Any] = {}
        try:
            for module in self.model.modules():
                tables: Tuple[Dict[str, Any], ...] = (module._parameters, module._buffers)
                for table in tables:
                    for name, tensor in list(table.items()):
                        if tensor is None or tensor.is_meta:
                            continue
                        copy = copies.get(id(tensor))
                        if copy is None:
                            copy = copies[id(tensor)] = _meta_like(tensor)
                        self.saved.append((table, name, tensor))
                        table[name] = copy
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for table, name, tensor in reversed(self.saved):
            table[name] = tensor
        self.saved = []


def _meta_like(tensor: torch.Tensor) -> torch.Tensor:
    meta = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta")
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(meta, requires_grad=tensor.requires_grad)
    return meta


def inputs_on(device: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """``args`` and ``kwargs`` with every tensor (in lists, tuples and dicts) moved to ``device``;
    a tensor passed twice is moved once, so the pass sees one input as before."""
    moved: Dict[int, torch.Tensor] = {}
    return _moved(args, device, moved), _moved(kwargs, device, moved)


def _moved(value: Any, device: str, moved: Dict[int, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        if id(value) not in moved:
            moved[id(value)] = value.to(device)
        return moved[id(value)]
    if isinstance(value, dict):
        return type(value)((k, _moved(v, device, moved)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_moved(v, device, moved) for v in value)
    return value


def check_device(device: Optional[str]) -> None:
    if device is not None and (not isinstance(device, (str, torch.device)) or str(device) != "meta"):
        raise ArgumentValueError(
            f"log_forward_pass(device={device!r}): only device='meta' is supported (a weights-free pass on meta "
            "copies of the parameters); to run on another device, move the model and inputs there yourself."
        )


# ----- passes whose operations torchlens could not see ----------------------------------------------
def active_modes() -> List[str]:
    """Names of the TorchFunctionModes and TorchDispatchModes in effect (``torch.device``'s own
    context, which only sets the device of new tensors, left out)."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    names = []
    for mode in list(_get_current_function_mode_stack()) + list(_get_current_dispatch_mode_stack()):
        if type(mode).__name__ != "DeviceContext":
            names.append(type(mode).__name__)
    return names


def lost_op_notes(modes: List[str], records: List[TensorLogEntry]) -> List[str]:
    """Notes for a pass that may have lost operations: a mode intercepted torch calls, or the
    outputs depend on no input (the operations between them ran where torchlens could not see)."""
    notes = []
    if modes:
        notes.append(
            f"A torch mode was active during the pass ({', '.join(sorted(set(modes)))}): torch sent the model's "
            "calls through its __torch_function__/__torch_dispatch__, so operations it replaced or ran itself may "
            "be missing or logged as the mode's own calls. Trace outside the mode for the model's own graph."
        )
    inputs = [e for e in records if e.kind == "input"]
    outputs = [e for e in records if e.kind == "output"]
    if inputs and outputs and not _reaches_input(outputs):
        notes.append(
            "No output of the model depends on any of its inputs in this trace: the operations between them ran "
            "where torchlens could not see them (or the model ignores its inputs). Check the graph before relying on it."
        )
    return notes


def _reaches_input(outputs: List[TensorLogEntry]) -> bool:
    """Depth first, the older of a record's first and last parents first: inputs are the
    oldest records, so the walk mostly takes the short way down (a residual connection rather
    than the block it skips), at the cost of one comparison per record."""
    seen: Set[int] = set()
    todo = list(outputs)
    while todo:
        e = todo.pop()
        if e.kind == "input":
            return True
        refs = e.parent_refs or ()
        if len(refs) > 1:
            first, last = refs[0][0], refs[-1][0]
            if first is not None and last is not None and first.raw_index < last.raw_index:
                refs = refs[::-1]  # the first is pushed last: taken next
        for parent, _ in refs:
            if parent is not None and id(parent) not in seen:
                seen.add(id(parent))
                todo.append(parent)
    return False


__all__ = [
    "META_NOTE",
    "MetaDeviceError",
    "MetaCopies",
    "is_meta_pass",
    "is_meta_history",
    "refuse_meta",
    "meta_note",
    "is_value_error",
    "data_dependent_error",
    "inputs_on",
    "check_device",
    "active_modes",
    "lost_op_notes",
]
