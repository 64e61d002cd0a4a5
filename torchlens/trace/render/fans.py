"""Wide fan-in and fan-out drawn through junctions, so ``dot`` stays fast.

A node with many incoming edges from far-apart places (``torch.stack`` of every step of a
sequence model: step k feeds the stack from k ranks away) makes ``dot`` create one virtual node
per rank an edge crosses, quadratic in the number of steps; its x-positioning then takes
minutes (100 steps: over 100 s). Here such edges meet a *bus*: one small junction point per
depth of the nodes they come from, chained towards the head. Each edge is then short and the
number of virtual nodes grows linearly. Fan-out (one input read by every step) gets the
mirror image. Graphviz's own ``concentrate=true`` does the same merging but is itself quadratic
(and has crashed with clusters in some versions), so it is not used.

Example:
    >>> import torch, torchlens as tl
    >>> from torchlens.trace.render.structure import build_structure
    >>> class Stack(torch.nn.Module):
    ...     def forward(self, x):
    ...         outs = []
    ...         for _ in range(10):
    ...             x = torch.tanh(x)
    ...             outs.append(x)
    ...         return torch.stack(outs)
    >>> h = tl.log_forward_pass(Stack(), torch.ones(2), random_seed=0)
    >>> s = build_structure(h)
    >>> sum(isinstance(n.item, Junction) for n in s.nodes.values())  # one per depth of tanh
    10
    >>> [e.tail.id for e in s.edges if e.head.id == "stack_1_2"]  # one edge into the stack
    ['fan_in.stack_1_2.9']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

WIDE_FAN = 8  # a node with at least this many incoming (or outgoing) data edges gets a bus


@dataclass
class Junction:
    """A point where the edges of a wide fan-in or fan-out meet (drawn as a small dot)."""

    label: str  # e.g. 'fan_in.stack_1_2.3': the head (or tail) it serves, and its index
    kind: str = "junction"


def group_wide_fans(
    nodes: List[Any],
    edges: List[Any],
    new_node: Callable[[str, Any], Any],
    new_edge: Callable[..., Any],
    common: Callable[..., Any],
    threshold: int = WIDE_FAN,
) -> List[Any]:
    """The edges to draw, with every wide fan-in and fan-out rerouted through junctions.

    ``nodes`` are in drawing order; ``new_node(id, cluster)`` places a junction node,
    ``new_edge(tail, head, like=edge or None, **fields)`` makes an edge, and
    ``common(clusters)`` is the deepest module box holding all the given boxes.
    """
    order = {id(n): i for i, n in enumerate(nodes)}
    data = [e for e in edges if e.kind == "data"]
    earliest, latest = _depths(nodes, data, order)
    into: Dict[int, List[Any]] = {}
    for e in data:
        into.setdefault(id(e.head), []).append(e)
    rerouted: Dict[int, List[Any]] = {}  # id(original edge) -> replacement edges
    for group in into.values():
        if len({id(e.tail) for e in group}) >= threshold:
            _fan_in(group, earliest, rerouted, new_node, new_edge=new_edge, common=common)
    out_of: Dict[int, List[Any]] = {}
    for e in data:
        if id(e) not in rerouted:
            out_of.setdefault(id(e.tail), []).append(e)
    for group in out_of.values():
        if len({id(e.head) for e in group}) >= threshold:
            _fan_out(group, latest, rerouted, new_node, new_edge=new_edge, common=common)
    result: List[Any] = []
    done = set()
    for e in edges:
        replacement = rerouted.get(id(e))
        if replacement is None:
            result.append(e)
        elif id(replacement) not in done:  # a bus replaces all its edges at the first of them
            done.add(id(replacement))
            result.extend(replacement)
    return result


def _depths(nodes: List[Any], data: List[Any], order: Dict[int, int]) -> Tuple[Dict[int, int], Dict[int, int]]:
    """Where ``dot`` will roughly put each node: the earliest rank (longest path from a source)
    and the latest (longest path to a sink, counted from the bottom). Only data edges that go
    forward in drawing order count (rolled drawings have cycles).

    A fan-in's sources are grouped by their earliest rank, a fan-out's targets by their latest:
    ``x[t]`` for step t depends on the input only, but ``dot`` draws it next to step t.
    """
    parents: Dict[int, List[Any]] = {}
    children: Dict[int, List[Any]] = {}
    for e in data:
        if order[id(e.tail)] < order[id(e.head)]:
            parents.setdefault(id(e.head), []).append(e.tail)
            children.setdefault(id(e.tail), []).append(e.head)
    earliest: Dict[int, int] = {}
    for n in nodes:
        earliest[id(n)] = 1 + max((earliest[id(t)] for t in parents.get(id(n), ())), default=-1)
    bottom = max(earliest.values(), default=0)
    latest: Dict[int, int] = {}
    for n in reversed(nodes):
        latest[id(n)] = min((latest[id(c)] for c in children.get(id(n), ())), default=bottom + 1) - 1
    return earliest, latest


def _by_depth(group: List[Any], end: Callable[[Any], Any], depth: Dict[int, int]) -> List[Tuple[int, List[Any]]]:
    levels: Dict[int, List[Any]] = {}
    for e in group:
        levels.setdefault(depth[id(end(e))], []).append(e)
    return sorted(levels.items())


def _fan_in(group, depth, rerouted, new_node, new_edge, common) -> None:
    head = group[0].head
    cluster = common([e.tail.cluster for e in group] + [head.cluster])
    edges: List[Any] = []
    previous = None
    for i, (_, level) in enumerate(_by_depth(group, lambda e: e.tail, depth)):
        junction = new_node(f"fan_in.{head.id}.{i}", cluster)
        for e in level:  # the tap keeps its pass label; positions move to the last edge
            edges.append(new_edge(e.tail, junction, like=e, show_positions=False, arrowhead="none"))
        if previous is not None:
            edges.append(new_edge(previous, junction, kind="bus", arrowhead="none"))
        previous = junction
    positions = [p for e in group for p in e.positions]
    edges.append(new_edge(previous, head, positions=positions, show_positions=any(e.show_positions for e in group)))
    for e in group:
        rerouted[id(e)] = edges


def _fan_out(group, depth, rerouted, new_node, new_edge, common) -> None:
    tail = group[0].tail
    cluster = common([e.head.cluster for e in group] + [tail.cluster])
    edges: List[Any] = []
    previous = tail
    for i, (_, level) in enumerate(_by_depth(group, lambda e: e.head, depth)):
        junction = new_node(f"fan_out.{tail.id}.{i}", cluster)
        edges.append(new_edge(previous, junction, kind="bus", arrowhead="none"))
        for e in level:  # each branch keeps its own label (argument position, passes)
            edges.append(new_edge(junction, e.head, like=e))
        previous = junction
    for e in group:
        rerouted[id(e)] = edges
