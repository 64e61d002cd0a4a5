"""Graph clean-up: which records are kept, their children, and which were made inside the model.

Records arrive in execution order, so every parent precedes its children and one sweep in each
direction is enough (linear in operations + edges).
"""

from __future__ import annotations

from typing import Dict, List

from ..records.tensor_log import TensorLogEntry

_SOURCES = ("input", "untraced")


def prune(entries: List[TensorLogEntry]) -> List[TensorLogEntry]:
    """Keep inputs, outputs, everything computed from an input, and every ancestor of a kept
    record; drop the rest (e.g. a buffer update that feeds nothing, ``torch.rand`` left unused).

    Also sets ``created_inside_model`` (the tensor does not depend on any input). An
    ``untraced`` node counts as an input here: what made it is unknown (most likely something
    computed from the inputs), and it and what it feeds stay in the history, visible.
    """
    n = len(entries)
    from_input = [False] * n
    keep = [False] * n
    for i, e in enumerate(entries):
        kind = e.kind
        if kind in _SOURCES:
            from_input[i] = keep[i] = True
            continue
        for p, _ in e.parent_refs:  # a loop, not any(): no generator per record
            if from_input[p.raw_index]:
                from_input[i] = keep[i] = True
                break
        else:
            keep[i] = kind == "output"
    for i in range(n - 1, -1, -1):
        if keep[i]:
            for p, _ in entries[i].parent_refs:
                keep[p.raw_index] = True
    kept = []
    for i, e in enumerate(entries):
        if keep[i]:
            e.created_inside_model = e.kind == "op" and not from_input[i]
            kept.append(e)
    return kept


def children_of(entries: List[TensorLogEntry]) -> Dict[int, List[TensorLogEntry]]:
    """raw_index -> children, each child once, in execution order."""
    children: Dict[int, List[TensorLogEntry]] = {e.raw_index: [] for e in entries}
    for e in entries:
        for p, _ in e.parent_refs:
            known = children[p.raw_index]
            if not known or known[-1] is not e:  # e is the last added to a parent it has twice (x * x)
                known.append(e)
    return children
