"""Which layer of the source run each ``at=`` key names: the key is resolved in the run that is
patched, and its counterpart found in the source.

* A module address (``'transformer.h.3'``, ``'rnn_cell:5'`` for its fifth pass) names the
  module's output in both runs: for runs of different lengths that is the same module at the
  same step. A module that returns several tensors is patched at its first one (``':1.0'``).
* ``'<module address>@input'``: the tensor entering that module call, in both runs (``sites.py``).
* A layer label (``'add_12_204'``, ``'tanh_1_6:3'``): the source's layer with that label when it
  is the same kind of op in the same module; otherwise the layer the compare feature matches to
  it (by module, layer type and place, ``answers/comparison/matching.py``), when that is in the same module.

A key the source lacks, or a layer without a counterpart, is a ``PatchError`` naming what the
source has instead.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from ..answers import Matching, match_histories
from ..history.index import Ambiguous
from ..history.model_history import ModelHistory
from ..layer_request import entries_for_key
from ..records.tensor_log import TensorLogEntry
from .select import PatchError
from .sites import is_input_key, module_input


@dataclass
class Target:
    """One patched layer: the key it came from, its entry in the run patched and in the source."""

    key: Any
    entry: TensorLogEntry
    source: TensorLogEntry


def resolve(history: ModelHistory, source: ModelHistory, keys: List[Any]) -> List[Target]:
    """The layers ``keys`` name in ``history`` and their counterparts in ``source``."""
    targets: List[Target] = []
    matching: Optional[Matching] = None
    seen: Dict[str, Any] = {}
    for key in keys:
        if is_input_key(key):
            targets.append(_input_target(history, source, key, seen))
            continue
        module_key = _module_key(history, key)
        entries = _entries(history, module_key if module_key is not None else key, "the run patched", key)
        for e in entries:
            if e.label in seen:
                raise PatchError(f"patch: {e.label} is named twice in at= (by {seen[e.label]!r} and {key!r}).")
            seen[e.label] = key
            if e.kind in ("input", "buffer"):
                raise PatchError(
                    f"patch: at={key!r} names {e.label}, an {e.kind} of the model; patch an operation instead "
                    "(to patch an input, pass the input you want)."
                )
            if module_key is not None:
                counterpart = _same_module(source, module_key, e, key)
            else:
                counterpart = _same_label(source, e)
                if counterpart is None:
                    matching = matching or match_histories(history, source)
                    counterpart = _matched(matching, source, e, key)
            if not isinstance(counterpart.activation, torch.Tensor):
                raise PatchError(
                    f"patch: the source has no saved activation for {counterpart.label} (at={key!r}); trace the "
                    "source with layers_to_save='all' (the default) or a list that includes it."
                )
            targets.append(Target(key, e, counterpart))
    if not targets:
        raise PatchError("patch: at= names no layer; give labels or module addresses, e.g. at=['transformer.h.3'].")
    return targets


def _input_target(history: ModelHistory, source: ModelHistory, key: str, seen: Dict[str, Any]) -> Target:
    e = module_input(history, key, "the run patched")
    if e.label in seen:
        raise PatchError(f"patch: {e.label} is named twice in at= (by {seen[e.label]!r} and {key!r}).")
    seen[e.label] = key
    counterpart = module_input(source, key, "the source run")
    if not isinstance(counterpart.activation, torch.Tensor):
        raise PatchError(f"patch: the source has no saved activation for {counterpart.label} (at={key!r}).")
    return Target(key, e, counterpart)


def _module_key(history: ModelHistory, key: Any) -> Optional[str]:
    """The key as a module output key (its first output for a module returning several), or
    None when it is not a module address."""
    if not isinstance(key, str):
        return None
    base, _, pass_text = key.rpartition(":")
    address = base if pass_text.isdigit() else key
    if address not in history.modules.passes:
        return None
    found = history.lookup_value(key)
    if isinstance(found, Ambiguous) and address == key and history.modules.passes[address] == 1:
        first = f"{key}:1.0"
        if isinstance(history.lookup_value(first), TensorLogEntry):
            return first
    if isinstance(found, Ambiguous) and address != key and history.lookup_value(f"{key}.0") is not None:
        return f"{key}.0"
    return key


def _entries(history: ModelHistory, key: Any, which: str, given: Any) -> List[TensorLogEntry]:
    try:
        return entries_for_key(history, key, "patch")
    except (ValueError, KeyError) as error:
        raise PatchError(f"patch: at={given!r} names no layer of {which}. {error}") from None


def _same_module(source: ModelHistory, key: str, e: TensorLogEntry, given: Any) -> TensorLogEntry:
    found = source.lookup_value(key)
    if isinstance(found, TensorLogEntry):
        return found
    if isinstance(found, Ambiguous):  # a module with several passes: the same pass
        for label in found.labels:
            if source[label].pass_num == e.pass_num:
                return source[label]
    address = key.rpartition(":")[0] if key.rpartition(":")[2].replace(".", "").isdigit() else key
    passes = source.modules.passes.get(address)
    if passes is not None:
        raise PatchError(
            f"patch: at={given!r}: module {address} ran {passes} time(s) in the source run, so it has no "
            f"counterpart of {key!r}; patch a pass both runs have."
        )
    close = difflib.get_close_matches(address, list(source.modules.passes), n=3)
    hint = f" Modules of the source with similar names: {', '.join(close)}." if close else ""
    raise PatchError(f"patch: at={given!r}: the source run has no module {address}.{hint}")


def _same_label(source: ModelHistory, e: TensorLogEntry) -> Optional[TensorLogEntry]:
    """The source's layer of the same label, if it is the same kind of op in the same module."""
    found = source.lookup_value(e.label)
    if isinstance(found, TensorLogEntry) and found.label == e.label and found.layer_type == e.layer_type:
        if _module_hint(found) == _module_hint(e):
            return found
    return None


def _matched(matching: Matching, source: ModelHistory, e: TensorLogEntry, given: Any) -> TensorLogEntry:
    for a, b in matching.pairs:
        if a.label == e.label and _module_hint(a) == _module_hint(b):  # matched ops of other modules: no
            return b
    if given in source:
        raise PatchError(
            f"patch: at={given!r} names {e.label} of the run patched, but the two runs differ in structure and "
            f"{given!r} in the source is a different operation; patch by module address (e.g. "
            f"{_module_hint(e)!r}) so both runs name the same place."
        )
    raise PatchError(
        f"patch: at={given!r} names {e.label} in the run patched, but the source run has no layer that matches it "
        f"(no such label, and no {e.layer_type} at the same place of module {_module_hint(e) or 'the model'}). "
        "Patch a layer both runs have, e.g. a module address."
    )


def _module_hint(e: TensorLogEntry) -> str:
    return e.module_stack[-1][0] if e.module_stack else ""


__all__ = ["Target", "resolve"]
