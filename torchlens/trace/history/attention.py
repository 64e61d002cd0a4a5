"""``history.attention(module)``: the attention probabilities of one module call, from a pass
logged with ``decompose=("sdpa",)`` (their layer type is ``records.attention.ATTENTION_TYPE``).
``history`` is a ``ModelHistory``, read through ``HistoryView``: model_history imports this file."""

from __future__ import annotations

import difflib
from typing import List, Optional, Tuple

import torch

from ...errors import TorchlensError
from ..records.attention import ATTENTION_TYPE
from ..records.tensor_log import TensorLogEntry
from .view import HistoryView

_HOW = "log the pass with tl.log_forward_pass(model, x, decompose=('sdpa',))"


class AttentionNotFoundError(TorchlensError, LookupError):
    """``history.attention(module)`` found no attention probabilities for that module call.

    Example:
        >>> import torchlens as tl
        >>> issubclass(tl.AttentionNotFoundError, tl.TorchlensError)
        True
    """


def attention_entries(history: HistoryView, module: Optional[str] = None) -> List[TensorLogEntry]:
    """The attention-probability layers of the module call ``module`` (``'h.0.attn'``, or
    ``'h.0.attn:2'`` for its second call; None: the whole pass), in execution order."""
    if module is None:
        found = [e for e in history.layer_list if e.layer_type == ATTENTION_TYPE]
        if found:
            return found
        raise AttentionNotFoundError(f"This pass has no attention probabilities: {_HOW}.")
    address, call = _module_call(history, module)
    found = [e for e in history.layer_list if e.layer_type == ATTENTION_TYPE and (address, call) in e.module_stack]
    if found:
        return found
    inside = [e for e in history.layer_list if (address, call) in e.module_stack]
    fused = [e.label for e in inside if e.func_name == "scaled_dot_product_attention"]
    softmax = [e.label for e in inside if e.layer_type == "softmax"]
    if fused:
        why = f"its attention ran as one fused op ({', '.join(fused)}): {_HOW}"
    elif softmax:  # eager attention, or nn.MultiheadAttention with need_weights=True: its own softmax
        why = (
            f"it computes its attention weights itself, with a softmax ({', '.join(softmax)}): read them with "
            f"history[{softmax[0]!r}].activation (nn.MultiheadAttention decomposes with need_weights=False)"
        )
    elif any(e.layer_type == ATTENTION_TYPE for e in history.layer_list):
        why = "no decomposed attention ran inside it (other modules have some: pass the attention module's address)"
    else:
        why = (
            "no attention probabilities were recorded in this pass: for models whose attention calls "
            f"F.scaled_dot_product_attention, {_HOW} (layers left out by layers_to_save are not kept)"
        )
    raise AttentionNotFoundError(f"No attention probabilities for module {module!r}: {why}.")


def attention(history: HistoryView, module: Optional[str] = None) -> torch.Tensor:
    """The attention probabilities ``[batch, heads, queries, keys]`` of one module call (None:
    the pass's only attention call)."""
    entries = attention_entries(history, module)
    if len(entries) > 1:
        where = f"Module {module!r}" if module is not None else "This pass"
        modules = sorted({e.containing_module for e in entries if e.containing_module})
        raise AttentionNotFoundError(
            f"{where} ran {len(entries)} attention calls ({', '.join(e.label for e in entries)}): pass the "
            f"address of the module that makes one of them ({', '.join(modules[:6]) or 'none'}), or read one "
            "with history[label].activation."
        )
    entry = entries[0]
    if not isinstance(entry.activation, torch.Tensor):
        raise AttentionNotFoundError(
            f"The attention probabilities of {module!r} ({entry.label}) were not saved: include "
            f"'{ATTENTION_TYPE}' (or {entry.label!r}) in layers_to_save, or save all layers."
        )
    return entry.activation


def _module_call(history: HistoryView, module: str) -> Tuple[str, int]:
    passes = history.modules.passes
    address, _, suffix = module.rpartition(":")
    call: Optional[int] = int(suffix) if address and suffix.isdigit() else None
    if call is None:
        address = module
    if address not in passes:
        if address in history.modules.types:
            raise AttentionNotFoundError(f"Module {address!r} was not called in this forward pass.")
        close = difflib.get_close_matches(address, list(passes), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise AttentionNotFoundError(f"{address!r} is not the address of a module of this model.{hint}")
    n = passes[address]
    if call is None:
        if n > 1:
            raise AttentionNotFoundError(
                f"Module {address!r} was called {n} times in this pass: say which, '{address}:1' to '{address}:{n}'."
            )
        return address, 1
    if not 1 <= call <= n:
        raise AttentionNotFoundError(
            f"Module {address!r} was called {n} time(s) in this pass, so {module!r} names no call: "
            f"use '{address}:1'" + (f" to '{address}:{n}'." if n > 1 else ".")
        )
    return address, call


__all__ = ["attention", "attention_entries", "AttentionNotFoundError"]
