"""The data the interactive graph page is drawn from: plain JSON-ready dicts built from a
``ModelHistory`` (read only; nothing here touches tracing or the browser).

``page_data(history)`` returns::

    {"model": ..., "summary": {...},
     "ops": [one dict per entry, in execution order: label, kind, shape, dtype, stats, ...],
     "frames": [source locations shared by the ops' call stacks],
     "views": {"unrolled": VIEW, "rolled": VIEW}}

A VIEW is what one mode shows: ``nodes`` (unrolled: one per entry; rolled: one per layer, with
its number of passes), ``edges`` (``[tail, head, text]``: argument positions, and in the rolled
view the passes an edge exists in when not all), and ``modules``: one container per module
call (unrolled, ids like ``'layer1:1'``) or per module (rolled, ids are addresses), each with
its ordered ``items`` (``['n', node]`` or ``['m', module id]``), the ``folds`` among its child
modules (``[first index in items, count]``: a run of calls of one class with the same inside),
and ``single`` when it holds exactly one operation (drawn as that operation, not a box). The
many inputs/outputs of one container (a HuggingFace cache, ../groups.py) are a container too,
with ``group`` (``'input'`` or ``'output'``) and an id in brackets (``'[output.past_key_values]'``): the page shows it
closed, as one node "output.past_key_values (24 tensors)" that opens on click.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render.graph_page.data import page_data
    >>> block = lambda: torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    >>> model = torch.nn.Sequential(*[block() for _ in range(4)])
    >>> data = page_data(tl.log_forward_pass(model, torch.ones(1, 3), random_seed=0))
    >>> root = data["views"]["unrolled"]["modules"][""]
    >>> root["folds"]    # the four blocks fold into one box "x4" (a one-operation module never folds)
    [[1, 4]]
    >>> data["ops"][1]["label"], data["ops"][1]["stats"]["n"]
    ('linear_1_1', 3)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import torch

from ....web.stats import tensor_stats
from ...records.tensor_log import TensorLogEntry
from ..groups import TensorGroup, tensor_groups
from ..style import COMMUTATIVE_TYPES, passes_text, positions_text
from .attention import entry_attention_map
from .overlay import Overlay, OverlayError

if TYPE_CHECKING:
    from ...history.model_history import ModelHistory

SOURCE_CONTEXT = 2


def _kind(entry: TensorLogEntry) -> str:
    """The node's look, as in the graphviz drawing."""
    if entry.is_untraced:
        return "untraced"
    if entry.kind in ("input", "output", "buffer"):
        return entry.kind
    if entry.bool_used:
        return "bool"
    if entry.param_addresses:
        return "params"
    return "op"


class _Frames:
    """Source locations shared by the call stacks of all operations (each stored once)."""

    def __init__(self) -> None:
        self.index: Dict[Tuple[int, int], int] = {}
        self.rows: List[Dict[str, Any]] = []

    def ids(self, entry: TensorLogEntry) -> List[int]:
        out = []
        for loc in entry.func_call_stack or ():
            key = (id(loc.code), loc.line_number)
            if key not in self.index:
                self.index[key] = len(self.rows)
                self.rows.append(
                    {
                        "file": loc.file,
                        "line": loc.line_number,
                        "function": loc.function,
                        "code": loc.source_lines(SOURCE_CONTEXT),
                    }
                )
            out.append(self.index[key])
        return out


# layer types whose output holds each value of its one parent exactly once, rearranged: the same
# statistics (and histogram) as the parent's, not read again
_SAME_VALUES = frozenset(
    "view reshape transpose permute contiguous flatten unflatten squeeze unsqueeze t clone detach identity "
    "output movedim swapaxes swapdims".split()
)


class _Stats:
    """``tensor_stats`` of each saved activation (the page's histograms: most of its cost). An
    op that only rearranges its one parent's values (a view, a transpose, the output) takes the
    parent's, when both activations are as the ops made them (their shapes; same count and dtype)."""

    def __init__(self) -> None:
        self.known: Dict[str, Tuple[int, Any, Optional[Dict[str, Any]]]] = {}  # label -> (numel, dtype, stats)

    def of(self, entry: TensorLogEntry) -> Optional[Dict[str, Any]]:
        value = entry.activation
        if not isinstance(value, torch.Tensor) or entry.shape is None or tuple(value.shape) != tuple(entry.shape):
            return tensor_stats(value)
        parents = entry.parent_layers or ()
        found = self.known.get(parents[0]) if len(parents) == 1 and entry.layer_type in _SAME_VALUES else None
        if found is not None and found[:2] == (value.numel(), value.dtype):
            stats = found[2]
        else:
            stats = tensor_stats(value)
        self.known[entry.label] = (value.numel(), value.dtype, stats)
        return stats


def _op_dict(entry: TensorLogEntry, frames: _Frames, stats: _Stats) -> Dict[str, Any]:
    shape = list(entry.shape) if entry.shape is not None else None
    op = {
        "label": entry.label,
        "layer": entry.layer_label,
        "type": entry.layer_type,
        "kind": _kind(entry),
        "func": entry.func_name,
        "shape": shape,
        "dtype": str(entry.dtype).replace("torch.", "") if entry.dtype is not None else None,
        "nbytes": entry.nbytes,
        "params": [[a, list(s)] for a, s in zip(entry.param_addresses or (), entry.param_shapes or ())],
        "num_params": entry.num_params or 0,
        "pass": entry.pass_num,
        "passes": entry.num_passes,
        "module": entry.containing_module,
        "modules": entry.containing_modules,
        "output_of": entry.modules_output_of,
        "address": entry.address,
        "elapsed": entry.elapsed,
        "inplace": bool(entry.is_inplace),
        "inside": bool(entry.created_inside_model),
        "grad_fn": entry.grad_fn_name,
        "note": entry.untraced_reason or entry.gradient_note,
        "parents": list(entry.parent_layers or ()),
        "children": list(entry.child_layers or ()),
        "stats": stats.of(entry),
        "stack": frames.ids(entry),
    }
    heat_map = entry_attention_map(entry)  # decomposed attention's probabilities: a heat map per head
    if heat_map is not None:
        op["attention"] = heat_map
    return op


def _needs_positions(entry: TensorLogEntry) -> bool:
    return len(set(entry.parent_layers or ())) >= 2 and entry.layer_type not in COMMUTATIVE_TYPES


def _position_text(entry: TensorLogEntry, parent: str) -> str:
    if not _needs_positions(entry):
        return ""
    return positions_text((entry.parent_arg_positions or {}).get(parent, ()))


class _ViewBuilder:
    """Module containers of one view, their ordered items, single-operation modules and folds."""

    def __init__(self, history: "ModelHistory") -> None:
        self.history = history
        self.modules: Dict[str, Dict[str, Any]] = {"": self._container("", None, None, None)}

    def _container(
        self, cid: str, address: Optional[str], parent: Optional[str], pass_num: Optional[int]
    ) -> Dict[str, Any]:
        types = self.history.modules.types
        address = address or ""
        return {
            "address": address,
            "pass": pass_num,
            "passes": self.history.modules.passes.get(address, 1),
            "type": types.get(address, "?") if address else self.history.model_name,
            "parent": parent,
            "items": [],
            "ops": 0,
            "folds": [],
            "single": None,
        }

    def place(self, node: int, chain: Sequence[Tuple[str, Optional[int]]]) -> None:
        """Put node ``node`` into the container of ``chain`` (outermost first), making the chain."""
        parent = ""
        self.modules[""]["ops"] += 1
        for address, pass_num in chain:
            cid = address if pass_num is None else f"{address}:{pass_num}"
            if cid not in self.modules:
                self.modules[cid] = self._container(cid, address, parent, pass_num)
                self.modules[parent]["items"].append(["m", cid])
            self.modules[cid]["ops"] += 1
            parent = cid
        self.modules[parent]["items"].append(["n", node])

    def place_in_group(self, node: int, group: TensorGroup) -> None:
        """Put node ``node`` into the container of its input/output group."""
        cid = f"[{group.address}]"
        if cid not in self.modules:
            made = self._container(cid, None, "", None)
            made.update(address=group.address, type=f"{len(group.labels)} tensors", group=group.kind)
            self.modules[cid] = made
            self.modules[""]["items"].append(["m", cid])
        self.modules[""]["ops"] += 1
        self.modules[cid]["ops"] += 1
        self.modules[cid]["items"].append(["n", node])

    def finish(self, signature_of_node: Sequence[Any], node_parents: Sequence[Sequence[int]]) -> None:
        for cid, m in self.modules.items():
            if cid and m["ops"] == 1 and len(m["items"]) == 1 and m["items"][0][0] == "n":
                m["single"] = m["items"][0][1]
        signatures: Dict[str, int] = {}
        table: Dict[Any, int] = {}

        def signature(cid: str) -> int:  # children are made before their parent: no deep recursion issue
            if cid in signatures:
                return signatures[cid]
            m = self.modules[cid]
            nodes = self.nodes_in(cid)
            local = {n: i for i, n in enumerate(nodes)}
            parts: List[Any] = [m["type"]]
            for kind, ref in m["items"]:
                parts.append(("m", signature(ref)) if kind == "m" else ("n", signature_of_node[ref]))
            parts.append(tuple(tuple(local.get(p, -1) for p in node_parents[n]) for n in nodes))
            key = tuple(parts)
            signatures[cid] = table.setdefault(key, len(table))
            return signatures[cid]

        for cid in reversed(list(self.modules)):  # innermost first (a child is made after its parent)
            signature(cid)
        for m in self.modules.values():
            items, i = m["items"], 0
            while i < len(items):
                j = i
                sub = self.modules[items[i][1]] if items[i][0] == "m" else None
                if sub is not None and sub["single"] is None and not sub.get("group"):
                    sig = signatures[items[i][1]]
                    while j + 1 < len(items) and items[j + 1][0] == "m" and signatures[items[j + 1][1]] == sig:
                        j += 1
                if j > i:
                    m["folds"].append([i, j - i + 1])
                i = j + 1

    def nodes_in(self, cid: str) -> List[int]:
        out: List[int] = []
        for kind, ref in self.modules[cid]["items"]:
            if kind == "n":
                out.append(ref)
            else:
                out.extend(self.nodes_in(ref))
        return out


def _unrolled_view(history: "ModelHistory", entries: List[TensorLogEntry]) -> Dict[str, Any]:
    index = {e.label: i for i, e in enumerate(entries)}
    builder = _ViewBuilder(history)
    groups = tensor_groups(entries)
    for i, e in enumerate(entries):
        if e.label in groups:
            builder.place_in_group(i, groups[e.label])
        else:
            builder.place(i, [(a, int(p)) for a, p in (e.module_stack or ())])
    edges, parents = [], []
    for i, e in enumerate(entries):
        mine = []
        for p in e.parent_layers or ():
            if p in index:
                edges.append([index[p], i, _position_text(e, p)])
                mine.append(index[p])
        parents.append(mine)
    builder.finish([(e.layer_type, tuple(map(tuple, e.param_shapes or ()))) for e in entries], parents)
    nodes = [{"op": i, "label": e.label, "passes": 1} for i, e in enumerate(entries)]
    return {"nodes": nodes, "edges": edges, "modules": builder.modules}


def _rolled_view(history: "ModelHistory", entries: List[TensorLogEntry]) -> Dict[str, Any]:
    op_index = {e.label: i for i, e in enumerate(entries)}
    layers: Dict[str, List[TensorLogEntry]] = {}
    for e in entries:
        layers.setdefault(e.layer_label, []).append(e)
    layer_index = {label: i for i, label in enumerate(layers)}
    layer_of = {e.label: e.layer_label for e in entries}
    builder = _ViewBuilder(history)
    groups = tensor_groups(entries)
    nodes: List[Dict[str, Any]] = []
    for i, (label, passes) in enumerate(layers.items()):
        if passes[0].label in groups:
            builder.place_in_group(i, groups[passes[0].label])
        else:
            builder.place(i, [(a, None) for a, _ in (passes[0].module_stack or ())])
        nodes.append(
            {
                "op": op_index[passes[0].label],
                "label": label,
                "passes": len(passes),
                "ops": [op_index[e.label] for e in passes],
            }
        )
    edge_passes: Dict[Tuple[int, int], Dict[str, Any]] = {}
    for e in entries:
        head = layer_index[e.layer_label]
        for p in e.parent_layers or ():
            if p not in layer_of:
                continue
            slot = edge_passes.setdefault((layer_index[layer_of[p]], head), {"passes": [], "pos": _position_text(e, p)})
            slot["passes"].append(e.pass_num or 1)
    edges: List[list] = []
    parents: List[List[int]] = [[] for _ in nodes]
    for (tail, head), slot in edge_passes.items():
        text = slot["pos"]
        total = int(nodes[head]["passes"])
        if total > 1 and len(set(slot["passes"])) < total:
            text = ", ".join(t for t in (text, passes_text(sorted(set(slot["passes"])))) if t)
        edges.append([tail, head, text])
        parents[head].append(tail)
    signature_of_node = [(entries[n["op"]].layer_type, n["passes"]) for n in nodes]
    builder.finish(signature_of_node, parents)
    return {"nodes": nodes, "edges": edges, "modules": builder.modules}


def _summary(history: "ModelHistory") -> Dict[str, Any]:
    return {
        "num_tensors": history.num_tensors,
        "tensor_bytes": history.tensor_bytes,
        "num_params": history.num_params,
        "param_bytes": history.param_bytes,
        "is_recurrent": history.is_recurrent,
        "max_passes": history.max_passes,
        "pass_time": history.pass_time,
        "notes": list(history.notes),
    }


def page_data(history: "ModelHistory", overlay: Any = None, focus: Optional[str] = None) -> Dict[str, Any]:
    """Everything the graph page shows for ``history``, as JSON-ready data (see the module doc);
    with ``overlay`` (see ``overlay.Overlay``) the colour of each node and the legend, with
    ``focus`` the label of the operation the page opens on (its modules open, its details shown).

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> d = page_data(h)
        >>> [op["label"] for op in d["ops"]], d["views"]["unrolled"]["edges"]
        (['input_1_0', 'linear_1_1', 'output_1_2'], [[0, 1, ''], [1, 2, '']])
    """
    entries = list(history.layer_list)
    frames = _Frames()
    stats = _Stats()
    ops = [_op_dict(e, frames, stats) for e in entries]
    layer_of = {e.label: e.layer_label for e in entries}
    if focus is not None and focus not in layer_of and focus not in set(layer_of.values()):
        raise OverlayError(
            f"focus {focus!r} is not an operation of this history; give a label such as {entries[-1].label!r} "
            "(history.layer_labels lists them)."
        )
    return {
        "model": history.model_name,
        "summary": _summary(history),
        "ops": ops,
        "frames": frames.rows,
        "views": {"unrolled": _unrolled_view(history, entries), "rolled": _rolled_view(history, entries)},
        "overlay": None if overlay is None else Overlay.of(overlay).page_spec(layer_of),
        "focus": focus,
    }


__all__ = ["page_data"]
