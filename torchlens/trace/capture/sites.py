"""Where a torch call comes from: the model's code, or torch's own kernel code.

Why a model on the ``meta`` device once traced into a dozen ``empty`` layers: many of torch's
meta kernels (and its fake-tensor kernels, Python decompositions and reference implementations)
are written in Python. The dispatcher runs them *inside* the C operator the model called, and
they call public torch functions (``torch.empty``, ``Tensor.new_empty``) that torchlens wraps.
Those calls are the operator's implementation, not the model's operations: logged, they replaced
the operator (the composite-function rule: its output was made by an inner logged call) with an
``empty`` that has no parents, and every operation upstream was pruned as unused.

A call whose caller is a file of torch's kernel code therefore runs unlogged, the operator it
belongs to is logged as one node. Whatever device the tensors are on, this is one dictionary
lookup by the caller's file name per call.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..records.position import OpRngState
from .ops import ACTIVE

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# torch's code that the dispatcher runs as an operator's kernel (meta, fake, decompositions, refs)
_KERNEL_PARTS = (
    "_meta_registrations.py",
    "_refs" + os.sep,
    "_prims" + os.sep,
    "_prims_common" + os.sep,
    "_decomp" + os.sep,
    "_subclasses" + os.sep,
)  # not _ops.py, _library, _higher_order_ops: the model's own calls of custom operators pass there


class _KernelFiles(Dict[str, bool]):
    """file name -> whether it is torch's kernel code; filled on first sight of each file."""

    def __missing__(self, filename: str) -> bool:
        inside = filename.startswith(_TORCH_DIR) and filename[len(_TORCH_DIR) :].startswith(_KERNEL_PARTS)
        self[filename] = inside
        return inside


KERNEL_FILES = _KernelFiles()


def run_kernel_call(func: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Run a call made by torch's kernel code with logging paused (its inner calls too)."""
    tracer = ACTIVE.tracer
    if tracer is None:  # no pass in progress (the tracer calls this during one): nothing to pause
        return func(*args, **kwargs)
    tracer.paused = True
    try:
        return func(*args, **kwargs)
    finally:
        tracer.paused = False


def grad_fn_of(tensor: torch.Tensor) -> Optional[torch.autograd.graph.Node]:
    """``tensor.grad_fn``, or None where torch refuses to give it: reading it raises for a view
    made under ``no_grad`` whose base was then written in place (``w[:, 0].mul_(2)``)."""
    try:
        return tensor.grad_fn
    except RuntimeError:
        return None


def rng_state() -> OpRngState:
    """The random number generators' state, so a random operation can be replayed exactly."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def raise_site(error: BaseException) -> str:
    """``, raised at file:line in func()`` for the innermost frame of the error's traceback."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    code = tb.tb_frame.f_code
    return f", raised at {code.co_filename}:{tb.tb_lineno} in {code.co_name}()"


__all__ = ["KERNEL_FILES", "run_kernel_call", "rng_state", "raise_site", "grad_fn_of"]
