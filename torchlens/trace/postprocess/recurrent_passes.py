"""Which records are passes of the same layer (recurrence detection).

The invariant:

* Operations of the same type that use the same parameter objects (and sit at the same position
  among their call's outputs) are one layer, whatever their call site: a weighted module called
  in a loop, or tied weights used twice.
* A parameter-free operation is identified by its *call site*: its function, the addresses of the
  modules it ran in, and the Python call stack down to the exact bytecode instruction (counted
  from the ``forward`` of the innermost module with parameters that it ran in, so the internals
  of a weighted block called from two places are passes like the block's weights; from the
  model's ``forward`` otherwise),
  together with its *anchor*: the layer of the most recently executed weighted operation among
  its ancestors. The same call site can only be reached again by a loop (or a function called
  again from the same line), so repeats at other places (``relu`` after every conv, look-alike
  parallel branches, a parameter-free module used outside and inside a loop) stay separate.
  Repeats of one call site are passes of one layer, except that occurrences with different
  anchors are split: a loop over *different* weighted layers (``for conv in self.convs:
  x = relu(conv(x))``) is a stack of distinct layers, not a recurrence. Two allowances cover the
  first iteration of a real loop, whose anchor lies before the loop: occurrences without any
  anchor join the site's only anchored group, and a single first occurrence joins the site's
  only other group when that group repeats.
* Inputs, outputs and buffers are layers of their own.

Passes are numbered in execution order. Cost: one sweep over the records and their edges, plus
hashing each record's key (a call site by the identity of its records: within a pass the same
code and bytecode offset is always the same record).
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, List, Optional, Tuple

from ..records.tensor_log import TensorLogEntry


def group_passes(
    entries: List[TensorLogEntry], module_frame_depths: Optional[Dict[Tuple[str, int], int]] = None
) -> List[List[TensorLogEntry]]:
    """Layers in order of their first pass; each layer is its passes in execution order.

    ``module_frame_depths``: for each pass of a module with parameters, the number of call
    frames above its ``forward`` (recorded during the pass).
    """
    depths = module_frame_depths or {}
    groups: Dict[Tuple[Any, ...], List[TensorLogEntry]] = {}
    anchors: Dict[int, Tuple[int, Hashable]] = {}  # raw_index -> (raw index of anchor, its key)
    no_anchor: Tuple[int, Hashable] = (-1, None)
    # module stacks are shared by the records made in one module call: their addresses and the
    # depth of the innermost weighted module's forward, worked out once per stack
    per_stack: Dict[int, Tuple[tuple, tuple, Optional[int]]] = {}
    for e in entries:
        if e.kind != "op":
            key: Tuple[Any, ...] = ("own", e.raw_index)
            anchor = no_anchor
        elif e.param_addresses:
            key = ("params", e.layer_type, e.param_addresses, e.output_index)
            anchor = (e.raw_index, key)
        else:
            anchor = no_anchor  # the latest anchor among the parents' (the first of equals)
            for p, _ in e.parent_refs:
                candidate = anchors[p.raw_index]
                if candidate[0] > anchor[0]:
                    anchor = candidate
            stack = e.module_stack
            known = per_stack.get(id(stack))
            if known is None or known[0] is not stack:
                known = per_stack[id(stack)] = (stack, tuple([a for a, _ in stack]), _frame_depth(stack, depths))
            depth = known[2]
            frames = e.call_frames if depth is None else e.call_frames[depth:]
            # a site by identity: a pass records one tuple per code and offset (capture/stack.py),
            # and hashing the tuple itself would hash each code object's bytecode and constants
            key = ("site", e.func_name, known[1], tuple(map(id, frames)), e.output_index)
        anchors[e.raw_index] = anchor
        groups.setdefault(key, []).append(e)
    if max(map(len, groups.values()), default=0) == 1:  # no repeats (told in C): a layer per group
        return list(groups.values())
    layers: List[List[TensorLogEntry]] = []
    split = False  # groups in order of their first occurrence are layers in order of their first pass
    for key, occurrences in groups.items():
        if len(occurrences) > 1 and key[0] == "site":
            found = _split_by_anchor([(e, anchors[e.raw_index][1]) for e in occurrences])
            split = split or len(found) > 1
            layers.extend(found)
        else:
            layers.append(occurrences)
    if split:
        layers.sort(key=lambda passes: passes[0].raw_index)
    return layers


def _frame_depth(module_stack: tuple, depths: Dict[Tuple[str, int], int]) -> Optional[int]:
    """Call frames above the forward of the innermost module with parameters in the stack."""
    for module_pass in reversed(module_stack):
        depth = depths.get(module_pass)
        if depth is not None:
            return depth
    return None


def _split_by_anchor(occurrences: List[Tuple[TensorLogEntry, Hashable]]) -> List[List[TensorLogEntry]]:
    by_anchor: Dict[Hashable, List[TensorLogEntry]] = {}
    for e, anchor in occurrences:
        by_anchor.setdefault(anchor, []).append(e)
    if len(by_anchor) == 1:
        return list(by_anchor.values())
    unanchored = by_anchor.pop(None, None)
    if unanchored is not None and len(by_anchor) == 1:
        return [sorted(unanchored + next(iter(by_anchor.values())), key=lambda e: e.raw_index)]
    if unanchored is None and len(by_anchor) == 2:
        first, second = by_anchor.values()
        if len(first) == 1 and len(second) > 1 and first[0].raw_index < second[0].raw_index:
            return [first + second]
    groups = list(by_anchor.values())
    if unanchored is not None:
        groups.append(unanchored)
    return groups
