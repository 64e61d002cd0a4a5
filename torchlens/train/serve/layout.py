"""Where the nodes of one call's graph go: laid out by graphviz's ``dot`` (plain output), or by
a simple layered layout when ``dot`` is not installed. Coordinates are in points, y downwards."""

from __future__ import annotations

import shutil
import subprocess
from typing import Dict, List, Tuple

from ..model import Call

_POINTS = 72.0
# More tensors than this in one container are one node, as on the graph page (trace/render/groups.py)
MAX_LOOSE = 8


def io_groups(names: List[str]) -> Dict[str, str]:
    """Input/output name -> the node it is drawn in, for those drawn together: the tensors of one
    container when there are more than ``MAX_LOOSE`` of them or two sit two levels or more inside
    it (a HuggingFace cache: ``output cache.layers.0.keys`` ... in ``output cache``), as the graph
    page folds them; an LSTM's ``(h_n, c_n)`` and separate arguments stay apart.

    Example:
        >>> io_groups(["output logits", "output cache.layers.0.keys", "output cache.layers.0.values"])
        {'output cache.layers.0.keys': 'output cache', 'output cache.layers.0.values': 'output cache'}
    """
    found: Dict[str, List[str]] = {}
    deep: Dict[str, int] = {}
    for name in names:
        kind, _, path = name.partition(" ")
        parts = path.split(".")
        if len(parts) == 1:
            if kind == "input":  # forward's own arguments
                continue
            container, levels = kind, 1  # a tensor of the whole output
        else:
            container, levels = f"{kind} {parts[0]}", len(parts) - 1
        found.setdefault(container, []).append(name)
        deep[container] = deep.get(container, 0) + (levels >= 2)
    return {
        name: container
        for container, members in found.items()
        if len(members) > MAX_LOOSE or deep[container] >= 2
        for name in members
    }


def _io_nodes(kind: str, tensors: List[Tuple[str, List[int]]], groups: Dict[str, str]) -> List[dict]:
    nodes: List[dict] = []
    folded: Dict[str, dict] = {}
    for name, shape in tensors:
        group = groups.get(name)
        if group is None:
            nodes.append({"id": name, "kind": kind, "label": name, "shape": shape})
        elif group in folded:
            folded[group]["members"].append([name, shape])
        else:
            folded[group] = {"id": group, "kind": kind, "label": group, "shape": shape, "members": [[name, shape]]}
            nodes.append(folded[group])
    for node in folded.values():
        node["label"] = f"{node['id']} ({len(node['members'])} tensors)"
    return nodes


def graph_nodes(call: Call, calls: Dict[str, Call]) -> List[dict]:
    """The nodes of ``call``'s inside: its inputs, one per child call, its outputs; the many
    tensors of one container (a cache) are one node with their names as ``members``
    (``io_groups``)."""
    groups = io_groups([name for name, _ in call.inputs + call.outputs])
    nodes = _io_nodes("input", call.inputs, groups)
    for cid in call.children:
        child = calls.get(cid)
        if child is None:
            continue
        prefix = call.address + "." if call.address else ""
        short = child.address[len(prefix) :] if child.address.startswith(prefix) else child.address
        n = cid.rpartition(":")[2]
        passes = sum(1 for c in call.children if c.rpartition(":")[0] == child.address)
        label = short + (f" ({n})" if passes > 1 else "")
        nodes.append(
            {
                "id": cid,
                "kind": "call",
                "label": label,
                "class_name": child.class_name,
                "has_inside": bool(child.children),
            }
        )
    nodes += _io_nodes("output", call.outputs, groups)
    return nodes


def _size(node: dict) -> Tuple[float, float]:
    text = max(len(node["label"]), len(node.get("class_name", "")))
    return max(90.0, 7.2 * text + 24.0), 46.0 if node["kind"] == "call" else 30.0


def layout(call: Call, calls: Dict[str, Call]) -> dict:
    """``{"nodes": [...with x, y, w, h], "edges": [{"from", "to", "points"}], "width", "height"}``."""
    nodes = graph_nodes(call, calls)
    known = {n["id"] for n in nodes}
    groups = io_groups([name for name, _ in call.inputs + call.outputs])
    ends = ((groups.get(a, a), groups.get(b, b)) for a, b in call.edges)  # a member's edges are its node's
    edges = list(dict.fromkeys((a, b) for a, b in ends if a in known and b in known))
    for n in nodes:
        n["w"], n["h"] = _size(n)
    placed = _dot_layout(nodes, edges) if shutil.which("dot") else None
    if placed is None:
        placed = _layered_layout(nodes, edges)
    placed["engine_nodes"] = len(nodes)
    return placed


def _dot_layout(nodes: List[dict], edges: List[Tuple[str, str]]) -> dict:
    index = {n["id"]: i for i, n in enumerate(nodes)}
    # nslimit bounds dot's network-simplex passes: 5x faster on wide calls (a GPT-2 body with
    # 80 cache outputs: 500 -> 90 ms) for the same picture
    lines = [
        "digraph G {",
        "rankdir=TB; nodesep=0.25; ranksep=0.35; nslimit=2; nslimit1=2;",
        'node [shape=box, fixedsize=true, label=""];',
    ]
    for i, n in enumerate(nodes):
        rank = ""
        lines.append(f"n{i} [width={n['w'] / _POINTS:.3f}, height={n['h'] / _POINTS:.3f}]{rank};")
    inputs = [f"n{index[n['id']]}" for n in nodes if n["kind"] == "input"]
    outputs = [f"n{index[n['id']]}" for n in nodes if n["kind"] == "output"]
    if inputs:
        lines.append("{rank=source; " + "; ".join(inputs) + "}")
    if outputs:
        lines.append("{rank=sink; " + "; ".join(outputs) + "}")
    for a, b in edges:
        lines.append(f"n{index[a]} -> n{index[b]};")
    lines.append("}")
    try:
        out = subprocess.run(
            ["dot", "-Tplain"], input="\n".join(lines), capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    height = 0.0
    placed_edges = []
    for line in out.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "graph":
            width, height = float(parts[2]) * _POINTS, float(parts[3]) * _POINTS
        elif parts[0] == "node":
            n = nodes[int(parts[1][1:])]
            n["x"], n["y"] = float(parts[2]) * _POINTS, height - float(parts[3]) * _POINTS
        elif parts[0] == "edge":
            count = int(parts[3])
            coords = [float(v) * _POINTS for v in parts[4 : 4 + 2 * count]]
            points = [[coords[k], height - coords[k + 1]] for k in range(0, len(coords), 2)]
            placed_edges.append(
                {
                    "from": nodes[int(parts[1][1:])]["id"],
                    "to": nodes[int(parts[2][1:])]["id"],
                    "points": points,
                    "spline": True,
                }
            )
    return {"nodes": nodes, "edges": placed_edges, "width": width, "height": height, "engine": "dot"}


def _layered_layout(nodes: List[dict], edges: List[Tuple[str, str]]) -> dict:
    """Longest-path layers (inputs first, outputs last), nodes side by side in each layer."""
    rank = {n["id"]: 0 for n in nodes}
    for _ in range(len(nodes)):  # relaxation: the graph is a DAG, so this settles
        changed = False
        for a, b in edges:
            if rank[b] < rank[a] + 1:
                rank[b], changed = rank[a] + 1, True
        if not changed:
            break
    last = max(rank.values(), default=0) + 1
    for n in nodes:
        if n["kind"] == "output":
            rank[n["id"]] = last
    layers: Dict[int, List[dict]] = {}
    for n in nodes:
        layers.setdefault(rank[n["id"]], []).append(n)
    width = max((sum(n["w"] + 20 for n in layer) for layer in layers.values()), default=100.0)
    y = 20.0
    for r in sorted(layers):
        layer = layers[r]
        x = (width - sum(n["w"] + 20 for n in layer)) / 2 + 10
        for n in layer:
            n["x"], n["y"] = x + n["w"] / 2, y + n["h"] / 2
            x += n["w"] + 20
        y += max(n["h"] for n in layer) + 30
    by_id = {n["id"]: n for n in nodes}
    placed = [
        {
            "from": a,
            "to": b,
            "spline": False,
            "points": [
                [by_id[a]["x"], by_id[a]["y"] + by_id[a]["h"] / 2],
                [by_id[b]["x"], by_id[b]["y"] - by_id[b]["h"] / 2],
            ],
        }
        for a, b in edges
    ]
    return {"nodes": nodes, "edges": placed, "width": width + 20, "height": y, "engine": "layered"}


__all__ = ["layout", "graph_nodes", "io_groups"]
