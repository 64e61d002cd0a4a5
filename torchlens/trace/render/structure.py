"""What the drawing shows, before any graphviz: visible nodes, edges and module boxes.

``build_structure`` reads a ``ModelHistory`` only (entries, rolled layers, module info) and
returns a ``GraphStructure``: one ``Node`` per entry (unrolled) or per layer (rolled), or per
collapsed module, or per ``TensorGroup`` (the many inputs/outputs of one container, groups.py); the ``Edge``s between them (data edges, ``'if'`` edges from a branch's
condition to its first operation, and any extra edges a caller adds, e.g. backward edges); and
the tree of module ``Cluster``s, each holding its nodes and the edges whose ends both lie in it.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render.structure import build_structure
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    >>> h = tl.log_forward_pass(model, torch.ones(1, 3), random_seed=0)
    >>> s = build_structure(h, "unrolled", None)
    >>> [n.id for n in s.nodes.values()]
    ['input_1_0', 'linear_1_1', 'relu_1_2', 'output_1_3']
    >>> s.nodes["linear_1_1"].inline_modules  # a one-operation module: no box, named in the node
    [('0', 'Linear')]
    >>> s = build_structure(h, "unrolled", None, inline_single_op_modules=False)
    >>> s.clusters[(("0", 1),)].nodes[0].id
    'linear_1_1'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import torch

from ...arguments import ArgumentValueError
from ..history.rolled import RolledLayer
from ..records.tensor_log import TensorLogEntry
from .fans import Junction, group_wide_fans
from .groups import TensorGroup, tensor_groups
from .style import COMMUTATIVE_TYPES, passes_text, positions_text

if TYPE_CHECKING:
    from ..history.model_history import ModelHistory

ClusterKey = Tuple[Tuple[str, Optional[int]], ...]  # ((address, pass or None), ...) outermost first
ExtraEdge = Tuple[str, str, Mapping[str, str]]  # (tail label, head label, graphviz attributes)


@dataclass
class CollapsedModule:
    """A module drawn as one node because it lies deeper than ``vis_nesting_depth``.

    ``pass_num`` is the module's pass in unrolled mode and ``None`` in rolled mode.
    """

    address: str
    pass_num: Optional[int]
    module_type: str
    num_passes: int
    outputs: List[Tuple[Optional[torch.Size], Optional[torch.dtype], Optional[int]]] = field(default_factory=list)
    members: List[str] = field(default_factory=list)  # labels of the entries/layers inside
    num_ops: int = 0
    param_numels: Dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``'features.6'``, or ``'fc:2'`` for a pass of a module that ran several times."""
        if self.pass_num is not None and self.num_passes > 1:
            return f"{self.address}:{self.pass_num}"
        return self.address

    @property
    def num_params(self) -> int:
        return sum(self.param_numels.values())


Item = Union[TensorLogEntry, RolledLayer, CollapsedModule, TensorGroup, Junction]


@dataclass
class Node:
    id: str
    item: Item
    cluster: ClusterKey
    # Single-operation modules drawn inside the node instead of as a box: (label, type), innermost first.
    inline_modules: List[Tuple[str, str]] = field(default_factory=list)


@dataclass
class Edge:
    """One drawn edge; several logged edges may merge into it (collapsed modules, rolled passes)."""

    tail: Node
    head: Node
    kind: str  # 'data', 'if', 'extra', or 'bus' (between the junctions of a wide fan, see fans.py)
    positions: List[Any] = field(default_factory=list)
    show_positions: bool = False
    child_passes: Set[int] = field(default_factory=set)
    child_total: int = 1
    parent_passes: Set[int] = field(default_factory=set)
    parent_total: int = 1
    attrs: Dict[str, str] = field(default_factory=dict)
    cluster: ClusterKey = ()
    ends: Optional[Tuple[Any, Any]] = None  # (parent, child) items of an edge rerouted through a junction

    def label_text(self, rolled: bool) -> Optional[str]:
        """Argument positions and, in rolled mode, the passes the edge belongs to (if not all)."""
        parts = []
        if self.kind == "data" and self.show_positions and self.positions:
            parts.append(positions_text(self.positions))
        if rolled and self.kind == "data":
            if self.child_total > 1 and len(self.child_passes) < self.child_total:
                parts.append(passes_text(self.child_passes))
            elif self.parent_total > 1 and len(self.parent_passes) < self.parent_total:
                parts.append(passes_text(self.parent_passes))
        return "\n".join(parts) or None


@dataclass
class Cluster:
    """A module box: one per module pass (unrolled) or per module (rolled). The root has key ()."""

    key: ClusterKey
    id: str
    address: str
    pass_num: Optional[int]
    module_type: str
    num_passes: int
    children: List[ClusterKey] = field(default_factory=list)
    nodes: List[Node] = field(default_factory=list)
    edges: List[Edge] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return len(self.key)


@dataclass
class GraphStructure:
    rolled: bool
    clusters: Dict[ClusterKey, Cluster]
    nodes: Dict[str, Node]  # by node id, in drawing order
    edges: List[Edge]


def needs_positions(entry: TensorLogEntry) -> bool:
    """Edges into ``entry`` carry argument positions: >= 2 distinct parents, not commutative."""
    return len(set(entry.parent_layers or ())) >= 2 and entry.layer_type not in COMMUTATIVE_TYPES


def _node_id(text: str) -> str:
    # ':' would read as a node port in DOT edge statements.
    return text.replace(":", "_pass")


def _chain(item: Union[TensorLogEntry, RolledLayer], rolled: bool) -> ClusterKey:
    if rolled:
        first = item.passes[0]  # type: ignore[union-attr]
        return tuple((address, None) for address, _ in (first.module_stack or ()))
    return tuple((address, int(p)) for address, p in (item.module_stack or ()))  # type: ignore[union-attr]


class _Builder:
    def __init__(self, history: "ModelHistory", rolled: bool, depth: Optional[int]) -> None:
        self.history = history
        self.rolled = rolled
        self.depth = depth
        self.entries: Dict[str, TensorLogEntry] = {e.label: e for e in history.layer_list}
        self.layer_of: Dict[str, str] = {e.label: e.layer_label for e in history.layer_list}
        root = Cluster(
            (), "root", "", None, module_type=history.modules.types.get("", history.model_name), num_passes=1
        )
        self.s = GraphStructure(rolled, {(): root}, {}, [])
        self.visible: Dict[str, Node] = {}  # entry/layer label -> node drawing it
        self.items: Dict[str, Any] = {}  # entry/layer label -> entry/RolledLayer
        self.collapsed: Dict[ClusterKey, Node] = {}
        self.edges: Dict[Tuple[str, str, str], Edge] = {}
        self.cluster_ids: Set[str] = set()
        self.groups = tensor_groups(history.layer_list)  # many inputs/outputs of one container: one node
        self.group_nodes: Dict[str, Node] = {}

    # ----- nodes and clusters -------------------------------------------------------------------
    def module_passes(self, address: str) -> int:
        return int(self.history.modules.passes.get(address, 1))

    def cluster(self, key: ClusterKey) -> Cluster:
        found = self.s.clusters.get(key)
        if found is not None:
            return found
        parent = self.cluster(key[:-1])
        address, pass_num = key[-1]
        passes = self.module_passes(address)
        base = "cluster_" + address + (f"_pass{pass_num}" if pass_num is not None and passes > 1 else "")
        cid, n = base, 1
        while cid in self.cluster_ids:
            n += 1
            cid = f"{base}_{n}"
        self.cluster_ids.add(cid)
        made = Cluster(
            key, cid, address, pass_num, module_type=self.history.modules.types.get(address, "?"), num_passes=passes
        )
        self.s.clusters[key] = made
        parent.children.append(key)
        return made

    def junction(self, node_id: str, cluster: ClusterKey) -> Node:
        node = Node(node_id, Junction(node_id), cluster)
        self.place(node)
        return node

    def place(self, node: Node) -> None:
        self.s.nodes[node.id] = node
        self.cluster(node.cluster).nodes.append(node)

    def add_item(self, item: Union[TensorLogEntry, RolledLayer]) -> None:
        self.items[item.label] = item
        group = self.groups.get(item.label)
        if group is not None:
            node = self.group_nodes.get(group.address)
            if node is None:
                node = self.group_nodes[group.address] = Node(_node_id(f"group.{group.address}"), group, ())
                self.place(node)
            self.visible[item.label] = node
            return
        chain = _chain(item, self.rolled)
        if item.kind == "untraced" and self.depth is not None:
            chain = chain[: self.depth]  # a gap in the trace stays visible, never folded into a box
        if self.depth is None or len(chain) <= self.depth:
            node = Node(_node_id(item.label), item, chain)
            self.place(node)
            self.visible[item.label] = node
            return
        key = chain[: self.depth + 1]
        node = self.collapsed.get(key)
        if node is None:
            address, pass_num = key[-1]
            made = CollapsedModule(
                address, pass_num, self.history.modules.types.get(address, "?"), self.module_passes(address)
            )
            node = Node(
                _node_id(f"module.{address}" + ("" if pass_num is None else f".pass{pass_num}")), made, key[:-1]
            )
            self.place(node)
            self.collapsed[key] = node
        module: CollapsedModule = node.item  # type: ignore[assignment]  # the node of a collapsed key
        module.members.append(item.label)
        if item.kind == "op":
            module.num_ops += 1
        for address, shape in zip(item.param_addresses or (), item.param_shapes or ()):
            module.param_numels[address] = math.prod(shape)
        self.visible[item.label] = node

    def collapsed_outputs(self) -> None:
        by_module: Dict[Tuple[str, Optional[int]], CollapsedModule] = {}
        for key, node in self.collapsed.items():
            by_module.setdefault(key[-1], node.item)  # type: ignore[arg-type]  # the node of a collapsed key
        if not by_module:
            return
        for e in self.history.layer_list:
            for address, pass_num in e.output_of_modules or ():
                module = by_module.get((address, None if self.rolled else int(pass_num)))
                out = (e.shape, e.dtype, e.nbytes)
                if module is not None and out not in module.outputs:
                    module.outputs.append(out)

    def module_label(self, address: str, pass_num: Optional[int]) -> str:
        if pass_num is not None and self.module_passes(address) > 1:
            return f"{address}:{pass_num}"
        return address

    def inline_single_op_modules(self) -> None:
        """Draw a module holding one operation (its output, plus maybe buffers) as that operation.

        A collapsed module of one operation becomes the operation's node again, and a module
        box around one operation is dropped; either way the node names the module(s).
        """
        nodes: Dict[str, Node] = {}
        for node_id, node in self.s.nodes.items():
            module = node.item
            main = [self.items[m] for m in getattr(module, "members", ()) if self.items[m].kind != "buffer"]
            if (
                not isinstance(module, CollapsedModule)
                or len(main) != 1
                or not self.is_output_of(main[0], (module.address, module.pass_num))
            ):
                nodes[node_id] = node
                continue
            depth = len(node.cluster)
            del self.collapsed[node.cluster + ((module.address, module.pass_num),)]
            for label in module.members:
                item = self.items[label]
                plain = Node(_node_id(label), item, node.cluster)
                if item is main[0]:
                    chain = _chain(item, self.rolled)[depth:]
                    plain.inline_modules = [
                        (self.module_label(a, p), self.history.modules.types.get(a, "?")) for a, p in reversed(chain)
                    ]
                nodes[plain.id] = self.visible[label] = plain
        self.s.nodes = nodes
        clusters = self.s.clusters
        self.rebucket()
        for key in sorted((k for k in clusters if k), key=len, reverse=True):
            cluster = clusters[key]
            main_nodes = [n for n in cluster.nodes if getattr(n.item, "kind", None) != "buffer"]
            if cluster.children or len(main_nodes) != 1 or not self.is_output_of(main_nodes[0].item, key[-1]):
                continue
            parent = clusters[key[:-1]]
            main_nodes[0].inline_modules.append(
                (self.module_label(cluster.address, cluster.pass_num), cluster.module_type)
            )
            for node in cluster.nodes:
                node.cluster = parent.key
                parent.nodes.append(node)
            parent.children.remove(key)
            del clusters[key]
        self.rebucket()

    def rebucket(self) -> None:
        """Refill each cluster's node list from the nodes' cluster keys, in drawing order."""
        for cluster in self.s.clusters.values():
            cluster.nodes = []
        for node in self.s.nodes.values():
            self.s.clusters[node.cluster].nodes.append(node)

    def is_output_of(self, item: Item, module: Tuple[str, Optional[int]]) -> bool:
        if isinstance(item, CollapsedModule):
            return False
        entries = item.passes if isinstance(item, RolledLayer) else [item]
        return any(  # a group of tensors or a junction is no module's output
            (a, None if self.rolled else int(p)) == module
            for e in entries
            for a, p in getattr(e, "output_of_modules", None) or ()
        )

    # ----- edges --------------------------------------------------------------------------------
    def key_of(self, label: str) -> str:
        return self.layer_of.get(label, label) if self.rolled else label

    def add_edge(
        self,
        parent_label: str,
        child_label: str,
        kind: str,
        positions: Sequence[Any] = (),
        show_positions: bool = False,
        attrs: Optional[Mapping[str, str]] = None,
    ) -> None:
        tail = self.visible.get(self.key_of(parent_label))
        head = self.visible.get(self.key_of(child_label))
        if tail is None or head is None:
            return  # an end that is not in this history (e.g. dropped unsaved layers)
        if tail is head and isinstance(head.item, (CollapsedModule, TensorGroup)):
            return  # an edge inside a collapsed module or group
        edge = self.edges.get((tail.id, head.id, kind))
        if edge is None:
            edge = Edge(tail, head, kind, attrs=dict(attrs or {}))
            self.edges[(tail.id, head.id, kind)] = edge
        edge.show_positions = (edge.show_positions or show_positions) and not isinstance(
            head.item, (CollapsedModule, TensorGroup)
        )
        edge.positions.extend(p for p in positions if p not in edge.positions)
        parent, child = self.entries.get(parent_label), self.entries.get(child_label)
        if parent is not None and child is not None:
            edge.child_passes.add(int(child.pass_num or 1))
            edge.parent_passes.add(int(parent.pass_num or 1))
            edge.child_total = max(edge.child_total, int(child.num_passes or 1))
            edge.parent_total = max(edge.parent_total, int(parent.num_passes or 1))

    def add_entry_edges(self, entry: TensorLogEntry) -> None:
        show = needs_positions(entry)
        positions = entry.parent_arg_positions or {}
        for parent in entry.parent_layers or ():
            self.add_edge(parent, entry.label, "data", positions.get(parent, ()), show_positions=show)
        condition = entry.branch_condition
        if condition is not None:
            self.add_edge(condition if isinstance(condition, str) else condition.label, entry.label, "if")


def _common_prefix(a: ClusterKey, b: ClusterKey) -> ClusterKey:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def build_structure(
    history: "ModelHistory",
    vis_mode: str = "unrolled",
    vis_nesting_depth: Optional[int] = None,
    extra_edges: Optional[Iterable[ExtraEdge]] = None,
    progress: Optional[Any] = None,
    inline_single_op_modules: bool = True,
) -> GraphStructure:
    """Nodes, edges and module boxes of the drawing of ``history`` (see the module docstring).

    Args:
        history: a ``ModelHistory`` (or any object with ``layer_list``, ``rolled_layers``,
            ``modules`` and ``model_name``).
        vis_mode: ``'unrolled'`` (a node per pass) or ``'rolled'`` (a node per layer).
        vis_nesting_depth: ``None`` draws every module box; ``N`` draws the boxes of the
            modules at most ``N`` levels deep and collapses each module ``N + 1`` levels deep
            into one node (``0``: the top-level modules are single nodes).
        extra_edges: ``(tail label, head label, graphviz attributes)`` to draw as well, rerouted
            like data edges (rolled mode accepts pass labels and maps them to their layer).
        progress: a wrapper for the iteration over entries (e.g. ``tqdm``), or None.
        inline_single_op_modules: a module whose box would hold a single operation (its
            output, plus any buffers it reads) gets no box; the node names the module instead.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> [(e.tail.id, e.head.id) for e in build_structure(h).edges]
        [('input_1_0', 'linear_1_1'), ('linear_1_1', 'output_1_2')]
    """
    rolled = vis_mode == "rolled"
    b = _Builder(history, rolled, vis_nesting_depth)
    items: List[Any] = list(history.rolled_layers.values()) if rolled else list(history.layer_list)
    for item in progress(items) if progress else items:
        b.add_item(item)
    b.collapsed_outputs()
    if inline_single_op_modules:
        b.inline_single_op_modules()
    for entry in history.layer_list:
        b.add_entry_edges(entry)
    for tail, head, attrs in extra_edges or ():
        for label in (tail, head):
            if b.key_of(label) not in b.visible:
                raise ArgumentValueError(f"extra_edges: {label!r} is not a layer label of this history.")
        b.add_edge(tail, head, "extra", attrs=attrs)
    edges = group_wide_fans(
        list(b.s.nodes.values()), list(b.edges.values()), b.junction, _derived_edge, common=_common_cluster
    )
    for edge in edges:
        edge.cluster = _common_prefix(edge.tail.cluster, edge.head.cluster)
        b.s.clusters[edge.cluster].edges.append(edge)
        b.s.edges.append(edge)
    return b.s


def _common_cluster(keys: List[ClusterKey]) -> ClusterKey:
    common = keys[0]
    for key in keys[1:]:
        common = _common_prefix(common, key)
    return common


def _derived_edge(
    tail: Node,
    head: Node,
    like: Optional[Edge] = None,
    kind: str = "data",
    positions: Optional[List[Any]] = None,
    show_positions: Optional[bool] = None,
    **attrs: str,
) -> Edge:
    """An edge of a junction (fans.py), copying what ``like`` shows."""
    edge = Edge(tail, head, kind)
    if like is not None:
        edge.attrs = dict(like.attrs)
        edge.positions, edge.show_positions = list(like.positions), like.show_positions
        edge.child_passes, edge.child_total = like.child_passes, like.child_total
        edge.parent_passes, edge.parent_total = like.parent_passes, like.parent_total
        edge.ends = like.ends or (like.tail.item, like.head.item)
    if positions is not None:
        edge.positions = positions
    if show_positions is not None:
        edge.show_positions = show_positions
    edge.attrs.update(attrs)
    return edge
