"""Models torchlens cannot see into as given: TorchScript (refused) and ``torch.compile`` (the
original module is traced instead, and compiled parts run eagerly during the pass).

Example:
    >>> import torch
    >>> model = torch.nn.Linear(2, 2)
    >>> traced, notes = traceable_model(torch.compile(model))
    >>> traced is model, notes[0].startswith("torch.compile")
    (True, True)
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Callable, Iterator, List, Tuple

import torch
from torch import nn

from ...errors import TorchlensError
from .args import tensors_in


class TorchScriptModelError(TorchlensError, TypeError):
    """The model is a TorchScript module, whose operations run where torchlens cannot see them."""


def traceable_model(model: nn.Module) -> Tuple[nn.Module, List[str]]:
    """The module to trace, and notes for the user about what was changed or cannot be seen.

    A TorchScript model raises ``TorchScriptModelError``: its forward runs in the TorchScript
    interpreter, so the trace would be input -> output with nothing between.
    """
    if isinstance(model, torch.jit.ScriptModule):
        raise TorchScriptModelError(
            f"log_forward_pass got a TorchScript module ({type(model).__name__}, from torch.jit.script or "
            "torch.jit.trace). Its operations run inside the TorchScript interpreter, which torchlens cannot "
            "see into: the log would be input -> output with nothing between. Pass the original eager "
            "nn.Module instead (the one you gave to torch.jit.script/trace)."
        )
    notes: List[str] = []
    original = getattr(model, "_orig_mod", None)
    if _is_compiled(model) and isinstance(original, nn.Module):
        notes.append(
            f"torch.compile: traced the original module (model._orig_mod, a {type(original).__name__}); compiled "
            "code is opaque to torchlens, so the eager module ran instead, with the same parameters."
        )
        model = original
    scripted = _top_scripted(model)
    if scripted:
        notes.append(
            f"TorchScript submodules ({', '.join(scripted)}) run where torchlens cannot see: their operations are "
            "missing (their outputs are 'untraced' nodes). Use the eager modules to see inside them."
        )
    return model, notes


@contextlib.contextmanager
def eager_only() -> Iterator[None]:
    """Compiled submodules and functions run eagerly during a pass: Dynamo would otherwise compile
    torchlens's own wrappers (slowly, with warnings about them) and hide the operations."""
    # Without Dynamo imported nothing can be compiled; importing it (about a second, and new torch
    # attributes) only to switch it off would be waste.
    if "torch._dynamo" not in sys.modules:
        yield
        return
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    with warnings.catch_warnings():
        # torch warns that our global module hooks also fire for a compiled submodule's wrapper;
        # the tracer counts only modules of the model's tree, so this is expected here
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
        if set_stance is None:  # torch < 2.6: nothing to switch
            yield
            return
        with set_stance("force_eager"):
            yield


def scripted_output(module: nn.Module, args: Any, entry_of: Callable[[torch.Tensor], Any]) -> Tuple[list, str]:
    """(parents, reason) for an untraced tensor that ``module`` returned: a TorchScript module's
    whole forward is out of sight, so its output comes from what it was given (the records of
    its tensor arguments, at their positions); of any other module nothing is known."""
    if not isinstance(module, torch.jit.ScriptModule):
        return [], ""
    parents = [(e, position) for position, t in tensors_in(args) if (e := entry_of(t)) is not None]
    reason = (
        "it is the output of a TorchScript submodule, whose operations run inside the TorchScript "
        "interpreter where torchlens cannot see them (pass the eager module, not its torch.jit.script)"
    )
    return parents, reason


def _is_compiled(model: nn.Module) -> bool:
    return any(cls.__name__ == "OptimizedModule" for cls in type(model).__mro__)


def _top_scripted(model: nn.Module) -> List[str]:
    found: List[str] = []
    for address, module in model.named_modules():
        if (
            address
            and isinstance(module, torch.jit.ScriptModule)
            and not any(address.startswith(outer + ".") for outer in found)
        ):
            found.append(address)
    return found
