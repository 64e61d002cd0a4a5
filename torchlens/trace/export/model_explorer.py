"""``format="model_explorer"``: the history as a graph for Google's Model Explorer (its JSON
graph format: a ``GraphCollection`` with one graph), loaded there as a JSON file.

Each entry is a node labelled by its layer type; its ``namespace`` is the path of the module
calls it ran in (``features/features.6``), so Model Explorer shows modules as boxes that open
and close; ``groupNodeAttributes`` give each box its module class and call. Edges carry
the producing tensor's shape and dtype; attributes hold the label, function, parameters and
source line.

Example:
    >>> import json, pathlib, tempfile, torch, torchlens as tl
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    >>> h = tl.log_forward_pass(model, torch.ones(1, 3))
    >>> path = h.export(tempfile.mkdtemp() + "/model.json", format="model_explorer")
    >>> [(n["label"], n["namespace"]) for n in json.loads(pathlib.Path(path).read_text())["graphs"][0]["nodes"]]
    [('input', ''), ('linear', '0'), ('relu', '1'), ('output', '')]
"""

from __future__ import annotations

import json
from typing import Any, Dict, List

from ._graph import Node, escape, nodes_of


def _kv(key: str, value: Any) -> Dict[str, str]:
    return {"key": key, "value": str(value)}


def _tensor_text(node: Node) -> str:
    shape = "?" if node.shape is None else "[" + ",".join(map(str, node.shape)) + "]"
    return f"{node.dtype or '?'}{shape}"


def _node(node: Node, index: Dict[str, str]) -> Dict[str, Any]:
    attrs = [_kv("label", node.label), _kv("function", node.func)]
    for key, value in (
        ("module", node.module),
        ("address", node.address),
        ("source", node.source),
        ("code", node.code),
    ):
        if value:
            attrs.append(_kv(key, value))
    for address, shape in node.params:
        attrs.append(_kv(f"param {address}", list(shape)))
    if node.missing:
        attrs.append(_kv("parents not kept", ", ".join(node.missing)))
    return {
        "id": index[node.label],
        "label": node.layer_type,
        "namespace": "/".join(escape(s) for s in node.scopes),
        "attrs": attrs,
        "incomingEdges": [
            {"sourceNodeId": index[p], "sourceNodeOutputId": "0", "targetNodeInputId": str(i)}
            for i, p in enumerate(node.inputs)
        ],
        "outputsMetadata": [
            {
                "id": "0",
                "attrs": [
                    _kv("tensor_name", node.label),
                    _kv("tensor_shape", _tensor_text(node)),
                    _kv("shape", list(node.shape) if node.shape is not None else "?"),
                    _kv("dtype", node.dtype or "?"),
                ],
            }
        ],
    }


def _groups(history: Any, nodes: List[Node]) -> Dict[str, Dict[str, str]]:
    """Each module box's attributes (module class, call), keyed by its namespace; '' is the model."""
    types = getattr(getattr(history, "modules", None), "types", {}) or {}
    groups: Dict[str, Dict[str, str]] = {"": {"model": history.model_name, "operations": str(len(nodes))}}
    for node in nodes:
        for depth in range(len(node.scopes)):
            path = "/".join(escape(s) for s in node.scopes[: depth + 1])
            if path not in groups:
                call = node.scopes[depth]
                groups[path] = {"module": call.rsplit(":", 1)[0], "call": call}
                module_type = types.get(call.rsplit(":", 1)[0])
                if module_type:
                    groups[path]["type"] = module_type
    return groups


def explorer_json(history: Any) -> Dict[str, Any]:
    """The Model Explorer ``GraphCollection`` of ``history`` (a dict)."""
    nodes = nodes_of(history)
    index = {n.label: str(i) for i, n in enumerate(nodes)}
    return {
        "label": history.model_name,
        "graphs": [
            {
                "id": history.model_name or "model",
                "nodes": [_node(n, index) for n in nodes],
                "groupNodeAttributes": _groups(history, nodes),
            }
        ],
    }


def write_model_explorer(history: Any, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(explorer_json(history), f, indent=1)
