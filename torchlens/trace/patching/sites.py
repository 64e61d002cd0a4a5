"""Places to patch that are not an operation's label: the input of a module call
(``'transformer.h.3.attn.c_proj@input'``), and the per-head tensor of every attention module
(``patch_sweep(over='heads')``).

A module's input is the tensor its first operation takes from outside the call. The per-head
tensor of an attention module (one with ``num_heads``, ``n_head``, ``num_attention_heads``...)
is the input of its output projection (the child module with weights that produces the
module's output, through children without weights such as dropout: GPT-2's ``c_proj``,
LLaMA's ``o_proj``); a module without one returns its heads merged (BERT's self-attention),
so its output is the per-head tensor.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from torch import nn

from ..history.model_history import ModelHistory
from ..records.tensor_log import TensorLogEntry
from .select import PatchError

INPUT = "@input"
HEAD_COUNT_NAMES = ("num_heads", "n_head", "n_heads", "num_attention_heads", "nhead")


def is_input_key(key: object) -> bool:
    return isinstance(key, str) and key.endswith(INPUT)


def module_input(history: ModelHistory, key: str, which: str) -> TensorLogEntry:
    """The tensor entering the module call ``key`` names (``'addr@input'``, ``'addr:2@input'``)."""
    call = _call(history, key[: -len(INPUT)], which, key)
    for e in history.layer_list:
        if call in _calls_of(e):
            outside = [history[p] for p in e.parent_layers if p in history and call not in _calls_of(history[p])]
            if outside:
                return outside[0]
    raise PatchError(f"patch: at={key!r}: no tensor enters module {call[0]} from outside in {which}.")


def _call(history: ModelHistory, text: str, which: str, key: str) -> Tuple[str, int]:
    base, sep, pass_text = text.rpartition(":")
    address, pass_num = (base, int(pass_text)) if sep and pass_text.isdigit() else (text, 1)
    passes = history.modules.passes.get(address)
    if passes is None:
        raise PatchError(f"patch: at={key!r}: {which} has no module {address} (or it did not run).")
    if pass_num > passes or (not sep and passes > 1):
        raise PatchError(
            f"patch: at={key!r}: module {address} ran {passes} time(s) in {which}; name one call, e.g. "
            f"'{address}:1{INPUT}'."
        )
    return address, pass_num


def _calls_of(e: TensorLogEntry) -> List[Tuple[str, int]]:
    return [tuple(c) for c in (e.module_stack or ())]  # type: ignore[misc]


def head_count(model: nn.Module, e: TensorLogEntry) -> Optional[int]:
    """The head count of the innermost module around ``e`` that has one."""
    for address, _ in reversed(_calls_of(e)):
        try:
            module = model.get_submodule(address)
        except AttributeError:
            continue
        count = _count(module)
        if count is not None:
            return count
    return None


def _count(module: nn.Module) -> Optional[int]:
    for name in HEAD_COUNT_NAMES:
        count = getattr(module, name, None)
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            return count
    return None


def head_sites(history: ModelHistory, model: nn.Module) -> List[str]:
    """For each attention module that ran once, the key of its per-head tensor (see above)."""
    keys = []
    for address, passes in history.modules.passes.items():
        if not address or passes != 1 or _count(model.get_submodule(address)) is None:
            continue
        keys.append(_per_head(history, model, address))
    if not keys:
        raise PatchError(
            "patch_sweep: over='heads' found no attention module (one with num_heads, n_head or "
            "num_attention_heads) that ran once; give over= a list of keys and heads='each' with n_heads=."
        )
    return keys


def _per_head(history: ModelHistory, model: nn.Module, address: str) -> str:
    e: Optional[TensorLogEntry] = history.module_output(address) or history.module_output(f"{address}:1.0")
    depth = address.count(".") + 1 if address else 0
    while e is not None and (address, 1) in _calls_of(e):
        inner = [c for c, _ in _calls_of(e) if c.startswith(address + ".")]
        if not inner:
            break  # an op of the module itself: its heads are merged here
        child = ".".join(inner[0].split(".")[: depth + 1])
        if any(True for _ in model.get_submodule(child).parameters()):
            return f"{child}{INPUT}"
        e = history[e.parent_layers[0]] if e.parent_layers else None
    return address


__all__ = ["INPUT", "is_input_key", "module_input", "head_count", "head_sites"]
