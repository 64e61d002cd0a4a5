"""Models torchlens cannot see into as given: TorchScript (refused) and ``torch.compile`` (the
original module is traced instead, and compiled parts run eagerly during the pass).

Example:
    >>> import torch
    >>> model = torch.nn.Linear(2, 2)
    >>> traced, notes, inventory = traceable_model(torch.compile(model))
    >>> traced is model, notes[0].startswith("torch.compile"), inventory.param_addresses[id(model.weight)]
    (True, True, 'weight')
"""

from __future__ import annotations

import contextlib
import operator
import sys
import threading
import types
import warnings
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn

from ...errors import TorchlensError
from ..records.position import Position
from ..records.tensor_log import TensorLogEntry
from .args import tensors_in
from .modules import ModelInventory, is_compiled


class TorchScriptModelError(TorchlensError, TypeError):
    """The model is a TorchScript module, whose operations run where torchlens cannot see them."""


def traceable_model(model: nn.Module) -> Tuple[nn.Module, List[str], ModelInventory]:
    """The module to trace, notes for the user about what was changed or cannot be seen, and
    the module's inventory (the walk over its modules that found those; a pass run right after
    takes it instead of walking them again).

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
    if is_compiled(model) and isinstance(original, nn.Module):
        notes.append(
            f"torch.compile: traced the original module (model._orig_mod, a {type(original).__name__}); compiled "
            "code is opaque to torchlens, so the eager module ran instead, with the same parameters."
        )
        model = original
    inventory = ModelInventory.of(model)
    if inventory.compiled:
        notes.append(
            f"torch.compile: compiled submodules ({', '.join(inventory.compiled)}) are traced through the modules "
            f"they wrap (their _orig_mod, shown at the submodule's own address), which {_HOW_COMPILED_CODE_RAN}."
        )
    if inventory.scripted:
        notes.append(
            f"TorchScript submodules ({', '.join(inventory.scripted)}) run where torchlens cannot see: their "
            "operations are missing (their outputs are 'untraced' nodes). Use the eager modules to see inside them."
        )
    return model, notes, inventory


@contextlib.contextmanager
def eager_only() -> Iterator[None]:
    """Compiled submodules and functions run eagerly during a pass: Dynamo would otherwise compile
    torchlens's own wrappers (slowly, with warnings about them) and hide the operations."""
    # Without Dynamo imported nothing can be compiled; importing it (about a second, and new torch
    # attributes) only to switch it off would be waste.
    if "torch._dynamo" not in sys.modules:
        yield
        return
    if not hasattr(getattr(torch, "compiler", None), "set_stance"):  # torch < 2.6: nothing to switch
        yield
        return
    with warnings.catch_warnings():
        # torch warns that our global module hooks also fire for a compiled submodule's wrapper;
        # the tracer counts only modules of the model's tree, so this is expected here
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
        _EAGER.enter()
        try:
            yield
        finally:
            _EAGER.leave()


class _EagerSwitch:
    """Dynamo's stance is one setting for the whole process, and passes in several threads
    overlap before the pass lock (each enters ``eager_only`` first): the first in switches to
    ``force_eager`` and keeps what was there, the last out puts it back. Nested ``with
    set_stance`` blocks in each thread would restore each other's switch, leaving
    ``torch.compile`` off for the rest of the process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.prior: Any = None

    def enter(self) -> None:
        with self.lock:
            if self.users == 0:
                self.prior = _dynamo_stance()
                torch.compiler.set_stance("force_eager")
            self.users += 1

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0:
                from torch._dynamo import eval_frame

                eval_frame._set_stance(self.prior)
                self.prior = None


def _dynamo_stance() -> Any:
    from torch._dynamo import eval_frame

    return eval_frame._stance


_EAGER = _EagerSwitch()


def scripted_output(
    module: nn.Module, args: Any, entry_of: Callable[[torch.Tensor], Optional[TensorLogEntry]]
) -> Tuple[List[Tuple[TensorLogEntry, Position]], str]:
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


_HOW_COMPILED_CODE_RAN = (
    "ran eagerly during the pass (torch.compiler.set_stance('force_eager')): the operations logged are "
    "those of their Python code; the compiled code did not run"
    if hasattr(getattr(torch, "compiler", None), "set_stance")
    else "ran through torch.compile (this torch cannot switch compiled code off): only operations "
    "Dynamo left to Python are logged"
)


def compiled_function_notes(entries: List[TensorLogEntry], code_ids: Optional[FrozenSet[int]] = None) -> List[str]:
    """A note naming the ``torch.compile``d functions (not modules) whose operations the pass
    logged: found in the entries' call stacks, as the frame that torch.compile's wrapper called
    (other Dynamo wrappers, such as ``torch._disable_dynamo`` around ``torch.utils.checkpoint``,
    compile nothing). ``code_ids``: the codes the pass's stacks passed through, if known (a pass
    that met no wrapper's code needs no look at its records)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:  # nothing can have been compiled
        return []
    wrappers, module_calls = _dynamo_codes(eval_frame)
    if code_ids is not None and wrappers.isdisjoint(code_ids):
        return []
    found: Dict[str, None] = {}
    seen: Set[int] = set()
    for e in entries:
        frames = e.call_frames
        if not frames or id(frames) in seen:
            continue
        seen.add(id(frames))
        if wrappers.isdisjoint(map(id, map(_first, frames))):  # in C: most stacks have no such frame
            continue
        in_module = False  # a compiled module's wrapper (named by traceable_model), not a function's
        for (code, _, _), (called, _, _) in zip(frames, frames[1:]):
            if id(code) in module_calls:  # OptimizedModule.__call__: its compiled forward comes next
                in_module = True
            elif id(code) in wrappers:
                if not in_module:
                    found[getattr(called, "co_qualname", called.co_name)] = None
                in_module = False
    if not found:
        return []
    return [f"torch.compile: compiled functions ({', '.join(found)}) {_HOW_COMPILED_CODE_RAN}."]


_first = operator.itemgetter(0)
_CODES: Dict[int, Tuple[types.ModuleType, Tuple[FrozenSet[int], FrozenSet[int]]]] = {}


def _dynamo_codes(eval_frame: types.ModuleType) -> Tuple[FrozenSet[int], FrozenSet[int]]:
    """Ids of the code of the wrapper ``torch.compile`` puts around a function (the functions
    nested in ``_TorchDynamoContext.__call__``), and of ``OptimizedModule.__call__``. By id:
    hashing a code object hashes its bytecode. They live as long as the module."""
    cached = _CODES.get(id(eval_frame))
    if cached is not None and cached[0] is eval_frame:
        return cached[1]
    pending = [_code(eval_frame, "_TorchDynamoContext")]
    wrappers: Set[int] = set()
    while pending:
        code = pending.pop()
        if code is not None:
            nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
            wrappers.update(map(id, nested))
            pending.extend(nested)
    module_call = _code(eval_frame, "OptimizedModule")
    _CODES[id(eval_frame)] = (eval_frame, (frozenset(wrappers), frozenset([id(module_call)] if module_call else [])))
    return _CODES[id(eval_frame)][1]


def _code(module: types.ModuleType, class_name: str) -> Optional[types.CodeType]:
    """The code of ``module.<class_name>.__call__`` as defined there, or None."""
    cls = vars(module).get(class_name)
    function = vars(cls).get("__call__") if isinstance(cls, type) else None
    return getattr(function, "__code__", None)
