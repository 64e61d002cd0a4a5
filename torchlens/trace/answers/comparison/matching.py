"""Which operation of one pass is which of another: the pairs ``tl.compare`` compares.

1. Same structure (the same labels in the same order, each with the same parents): by label.
2. Otherwise, step by step, each op of ``b`` in execution order:

   * module calls are aligned first: each call's signature is the sequence of layer types run
     inside it, and the two sequences of calls (the model's own forward first) are aligned
     (``difflib``), so ``blk.lin_a`` of a port lines up with ``block.fc1`` of the reference
     when both run a ``linear`` at the same place, and ``gpt.h.0`` of a wrapped model with
     ``h.0``; calls left over are paired by depth and order;
   * along edges: an op whose parents are all matched takes the unmatched child of their
     counterparts with the same layer type and the same parents (the one in the corresponding
     module call first, else the first in execution order), never one inside a module call
     that corresponds to another call (in a run with more time steps, the last state's child
     in the cell's next step is not the head that follows it in the shorter run);
   * by place: otherwise the op with the same layer type and the same position among ops of
     that type in the corresponding module call, unless their matched parents disagree;
   * then a sweep from the outputs back: an unmatched parent of a matched op takes the
     unmatched parent of its counterpart with the same layer type; and edges once more.

   Inputs pair by address, else by order; outputs likewise.

What it cannot match: an op computed another way (``x @ w.T + b`` against ``F.linear``; a
fused ``scaled_dot_product_attention`` against softmax and matmuls), an op that exists on one
side only (``unmatched_a`` / ``unmatched_b``); after such a gap, matching resumes along edges
and by place.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, Dict, List, Optional, Tuple

from ...history.model_history import ModelHistory
from ...records.tensor_log import TensorLogEntry

Call = Tuple[str, int]  # (module address, pass); ('', 1) is the model's own forward
_ROOT: Call = ("", 1)
_ENDS = ("input", "output")


@dataclass
class Matching:
    """Matched pairs (in ``a``'s execution order), how each was matched, and what is left."""

    pairs: List[Tuple[TensorLogEntry, TensorLogEntry]]
    how: Dict[str, str]  # label in a -> 'label', 'address', 'edge', 'place', 'child'
    unmatched_a: List[str] = field(default_factory=list)
    unmatched_b: List[str] = field(default_factory=list)
    by_label: bool = False
    missing_a: List[str] = field(default_factory=list)  # same structure: kept in b only (layers_to_save)
    missing_b: List[str] = field(default_factory=list)


def all_labels(history: ModelHistory) -> List[str]:
    """Every label of the pass, also those a ``layers_to_save`` subset dropped."""
    return list(getattr(history, "_all_labels", None) or history.layer_labels)


def match_histories(a: ModelHistory, b: ModelHistory) -> Matching:
    """The pairs of ops of ``a`` and ``b`` that are the same computation (see the module text)."""
    if all_labels(a) == all_labels(b) and _same_edges(a, b):
        return _by_label(a, b)
    return _Matcher(a, b).run()


def _same_edges(a: ModelHistory, b: ModelHistory) -> bool:
    in_b = {e.label: e for e in b.layer_list}
    for e in a.layer_list:
        other = in_b.get(e.label)
        if other is not None and (other.parent_layers != e.parent_layers or other.layer_type != e.layer_type):
            return False
    return True


def _by_label(a: ModelHistory, b: ModelHistory) -> Matching:
    in_b = {e.label: e for e in b.layer_list}
    in_a = {e.label for e in a.layer_list}
    pairs = [(e, in_b[e.label]) for e in a.layer_list if e.label in in_b]
    return Matching(
        pairs=pairs,
        how={e.label: "label" for e, _ in pairs},
        by_label=True,
        missing_a=[x for x in in_b if x not in in_a],
        missing_b=[x for x in in_a if x not in in_b],
    )


def _innermost(e: TensorLogEntry) -> Call:
    return tuple(e.module_stack[-1]) if e.module_stack else _ROOT  # type: ignore[return-value]


def _calls(history: ModelHistory) -> Dict[Call, Tuple[int, List[str]]]:
    """Each module call, in order of first op, the model's own forward first: (depth, layer
    types of every op inside it, inputs and outputs left out)."""
    calls: Dict[Call, Tuple[int, List[str]]] = {_ROOT: (0, [])}
    for e in history.layer_list:
        if e.kind in _ENDS:
            continue
        calls[_ROOT][1].append(e.layer_type)
        for depth, call in enumerate(e.module_stack, start=1):
            calls.setdefault(tuple(call), (depth, []))[1].append(e.layer_type)  # type: ignore[arg-type]
    return calls


def align_calls(a: ModelHistory, b: ModelHistory) -> Dict[Call, Call]:
    """Module call of ``b`` -> the module call of ``a`` it corresponds to. Calls of the same
    module with the same signature anchor the alignment (so in runs with more time steps the
    extra steps of a cell stay unmatched instead of shifting the head onto the cell); the calls
    between anchors align by signature alone, which leaves the address and depth out, so a port
    (``blk.lin_a`` against ``block.fc1``) or a model wrapped in another module (``gpt.h.0``
    against ``h.0``) still aligns."""
    calls_a, calls_b = _calls(a), _calls(b)
    keys_a, keys_b = list(calls_a), list(calls_b)
    named_a = [(k[0], tuple(types)) for k, (_, types) in calls_a.items()]
    named_b = [(k[0], tuple(types)) for k, (_, types) in calls_b.items()]
    mapping: Dict[Call, Call] = {}
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, named_a, named_b, autojunk=False).get_opcodes():
        if tag == "equal":
            mapping.update(zip(keys_b[j1:j2], keys_a[i1:i2]))
        else:
            mapping.update(_align_by_signature(calls_a, calls_b, keys_a[i1:i2], keys_b[j1:j2]))
    taken = set(mapping.values())
    for call in keys_b:  # left over: the same address, if the other side has it free
        if call not in mapping and call in calls_a and call not in taken:
            mapping[call] = call
    return mapping


def _align_by_signature(calls_a: Dict[Call, Any], calls_b: Dict[Call, Any], keys_a: List[Call], keys_b: List[Call]):
    """Calls of ``b`` -> calls of ``a`` between two anchors: equal signatures in order, and in
    a stretch of different content, by depth within it, in order."""
    mapping: Dict[Call, Call] = {}
    sigs_a = [tuple(calls_a[k][1]) for k in keys_a]
    sigs_b = [tuple(calls_b[k][1]) for k in keys_b]
    for tag, i1, i2, j1, j2 in SequenceMatcher(None, sigs_a, sigs_b, autojunk=False).get_opcodes():
        if tag == "equal":
            mapping.update(zip(keys_b[j1:j2], keys_a[i1:i2]))
        elif tag == "replace":  # same place, different content: pair by depth within the block, in order
            depths_a = _relative([calls_a[k][0] for k in keys_a[i1:i2]])
            depths_b = _relative([calls_b[k][0] for k in keys_b[j1:j2]])
            for block in SequenceMatcher(None, depths_a, depths_b, autojunk=False).get_matching_blocks():
                for n in range(block.size):
                    mapping[keys_b[j1 + block.b + n]] = keys_a[i1 + block.a + n]
    return mapping


def _relative(depths: List[int]) -> List[int]:
    low = min(depths, default=0)
    return [d - low for d in depths]


class _Matcher:
    def __init__(self, a: ModelHistory, b: ModelHistory) -> None:
        self.a, self.b = a, b
        self.entry_a = {e.label: e for e in a.layer_list}
        self.entry_b = {e.label: e for e in b.layer_list}
        self.calls = align_calls(a, b)
        self.aligned_a = set(self.calls.values())
        self.ab: Dict[str, str] = {}
        self.ba: Dict[str, str] = {}
        self.how: Dict[str, str] = {}
        self.place_a: Dict[Tuple[Call, str, int], TensorLogEntry] = {}
        for e, key in zip(a.layer_list, _places(a.layer_list, lambda call: call)):
            self.place_a[key] = e
        self.place_b = dict(zip((e.label for e in b.layer_list), _places(b.layer_list, self.calls.get)))

    def pair(self, ea: TensorLogEntry, eb: TensorLogEntry, how: str) -> None:
        self.ab[ea.label], self.ba[eb.label], self.how[ea.label] = eb.label, ea.label, how

    def run(self) -> Matching:
        self.ends()
        self.forward()
        self.backward()
        self.forward()
        order = {label: n for n, label in enumerate(self.entry_a)}
        pairs = sorted(
            ((self.entry_a[x], self.entry_b[y]) for x, y in self.ab.items()), key=lambda p: order[p[0].label]
        )
        return Matching(
            pairs=pairs,
            how=self.how,
            unmatched_a=[x for x in self.entry_a if x not in self.ab],
            unmatched_b=[x for x in self.entry_b if x not in self.ba],
        )

    def ends(self) -> None:
        """Inputs and outputs: by address, then the rest by order."""
        for kind in _ENDS:
            side_a = [e for e in self.a.layer_list if e.kind == kind]
            side_b = [e for e in self.b.layer_list if e.kind == kind]
            by_address = {e.address: e for e in side_a if e.address}
            for eb in side_b:
                ea = by_address.get(eb.address)
                if ea is not None and ea.label not in self.ab:
                    self.pair(ea, eb, "address")
            rest_a = [e for e in side_a if e.label not in self.ab]
            rest_b = [e for e in side_b if e.label not in self.ba]
            for ea, eb in zip(rest_a, rest_b):
                self.pair(ea, eb, "address")

    def forward(self) -> None:
        for eb in self.b.layer_list:
            if eb.label in self.ba or eb.kind in _ENDS:
                continue
            found = self.along_edges(eb)
            if found is not None:
                self.pair(found, eb, "edge")
                continue
            found = self.by_place(eb)
            if found is not None:
                self.pair(found, eb, "place")

    def along_edges(self, eb: TensorLogEntry) -> Optional[TensorLogEntry]:
        parents = [self.ba.get(p) for p in eb.parent_layers]
        known = [p for p in parents if p is not None]
        if not known:
            return None
        want = Counter(known)
        candidates = []
        for child in self.entry_a[known[0]].child_layers:
            ea = self.entry_a.get(child)
            if ea is None or ea.label in self.ab or ea.layer_type != eb.layer_type or ea.kind in _ENDS:
                continue
            if len(known) == len(parents):
                if Counter(ea.parent_layers) == want:
                    candidates.append(ea)
            elif not self.contradicts(ea, eb):
                candidates.append(ea)
        target = self.calls.get(_innermost(eb))
        if target is not None:  # a child inside a call that corresponds to another one is not it
            candidates = [ea for ea in candidates if _innermost(ea) == target or _innermost(ea) not in self.aligned_a]
        if not candidates:
            return None
        place = self.place_b.get(eb.label)
        for ea in candidates:
            if self.place_a.get(place) is ea:  # type: ignore[arg-type]
                return ea
        return candidates[0] if len(known) == len(parents) or len(candidates) == 1 else None

    def by_place(self, eb: TensorLogEntry) -> Optional[TensorLogEntry]:
        place = self.place_b.get(eb.label)
        ea = self.place_a.get(place) if place is not None else None  # type: ignore[arg-type]
        if ea is None or ea.label in self.ab or ea.kind in _ENDS or self.contradicts(ea, eb):
            return None
        return ea

    def contradicts(self, ea: TensorLogEntry, eb: TensorLogEntry) -> bool:
        """A parent of one is matched to something that is not a parent of the other."""
        parents_a, parents_b = set(ea.parent_layers), set(eb.parent_layers)
        if any(self.ab[p] not in parents_b for p in ea.parent_layers if p in self.ab):
            return True
        return any(self.ba[p] not in parents_a for p in eb.parent_layers if p in self.ba)

    def backward(self) -> None:
        """From matched ops back to their unmatched parents of the same layer type."""
        for eb in reversed(self.b.layer_list):
            label_a = self.ba.get(eb.label)
            if label_a is None:
                continue
            free_a = [
                self.entry_a[p] for p in self.entry_a[label_a].parent_layers if p in self.entry_a and p not in self.ab
            ]
            for p in eb.parent_layers:
                pb = self.entry_b.get(p)
                if pb is None or p in self.ba:
                    continue
                for pa in free_a:
                    if pa.label not in self.ab and pa.layer_type == pb.layer_type and pa.kind == pb.kind:
                        self.pair(pa, pb, "child")
                        break


def _places(entries: List[TensorLogEntry], map_call) -> List[Optional[Tuple[Call, str, int]]]:
    """(module call, layer type, k): the k-th op of its type directly in its innermost module
    call; the call is mapped through ``map_call`` (None: a call without counterpart)."""
    counts: Dict[Tuple[Call, str], int] = {}
    out: List[Optional[Tuple[Call, str, int]]] = []
    for e in entries:
        call = _innermost(e)
        k = counts.get((call, e.layer_type), 0)
        counts[(call, e.layer_type)] = k + 1
        mapped = map_call(call)
        out.append(None if mapped is None else (mapped, e.layer_type, k))
    return out


__all__ = ["Matching", "match_histories", "align_calls", "all_labels"]
