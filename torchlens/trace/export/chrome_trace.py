"""``format="chrome_trace"``: the operations of a history as a trace for Perfetto
(ui.perfetto.dev) and ``chrome://tracing``: the Trace Event Format's JSON object.

One complete slice (``ph: "X"``) per operation, named by its label, with its module, shape,
dtype, function and source line as args. Tracks are module depths: track ``d`` holds the
calls of modules ``d`` deep (track 0: the model's own ``forward``) and the operations that
ran directly in them, nested under their module's slice, so each track reads as one level of
the model. Durations are each operation's own time as the tracer measured it on the host
(``entry.elapsed``), laid end to end in execution order: the tracer's own work between
operations is left out, and on a GPU an operation's time is its launch, not its kernel.

Example:
    >>> import json, pathlib, tempfile, torch, torchlens as tl
    >>> h = tl.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()), torch.ones(1, 3))
    >>> path = h.export(tempfile.mkdtemp() + "/trace.json", format="chrome_trace")
    >>> [(e["name"], e["tid"]) for e in json.loads(pathlib.Path(path).read_text())["traceEvents"] if e["ph"] == "X"]
    [('0', 1), ('linear_1_1', 1), ('1', 1), ('relu_1_2', 1)]
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from ._graph import Node, nodes_of

PID = 1


def _us(ns: int) -> float:
    return ns / 1000.0  # the format's unit; both ends of nested slices come from the same integers


def _op_event(node: Node, start: int, end: int) -> Dict[str, Any]:
    args: Dict[str, Any] = {
        "label": node.label,
        "function": node.func,
        "module": node.module,
        "shape": list(node.shape) if node.shape is not None else None,
        "dtype": node.dtype,
    }
    if node.source:
        args["source"] = node.source
    if node.code:
        args["code"] = node.code
    if node.params:
        args["params"] = {address: list(shape) for address, shape in node.params}
    return {
        "name": node.label,
        "cat": "op",
        "ph": "X",
        "ts": _us(start),
        "dur": _us(end - start),
        "pid": PID,
        "tid": len(node.scopes),
        "args": args,
    }


def trace_events(history: Any) -> Dict[str, Any]:
    """The trace of ``history`` as the Trace Event Format's JSON object (a dict)."""
    ops = [n for n in nodes_of(history) if n.kind == "op"]
    spans: List[Tuple[int, int]] = []
    calls: Dict[Tuple[str, ...], List[int]] = {}  # module call (its scope path) -> [start, end] in ns
    order: List[Tuple[str, ...]] = []
    clock = 0
    for node in ops:
        start, clock = clock, clock + max(0, round(node.elapsed * 1e9))
        spans.append((start, clock))
        for depth in range(1, len(node.scopes) + 1):
            key = tuple(node.scopes[:depth])
            if key not in calls:
                calls[key] = [start, clock]
                order.append(key)
            calls[key][1] = clock
    events: List[Dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": history.model_name}},
    ]
    depths = sorted({len(n.scopes) for n in ops} | {len(k) for k in calls} | {0})
    for depth in depths:
        name = "model" if depth == 0 else f"modules at depth {depth}"
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": depth, "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": depth, "args": {"sort_index": depth}})
    types = getattr(getattr(history, "modules", None), "types", {}) or {}
    slices: List[Dict[str, Any]] = []
    for key in order:
        start, end = calls[key]
        address = key[-1].rsplit(":", 1)[0]
        slices.append(
            {
                "name": key[-1],
                "cat": "module",
                "ph": "X",
                "ts": _us(start),
                "dur": _us(end - start),
                "pid": PID,
                "tid": len(key),
                "args": {"module": key[-1], "type": types.get(address, ""), "path": "/".join(key)},
            }
        )
    slices += [_op_event(node, start, end) for node, (start, end) in zip(ops, spans)]
    # a parent before its children when they start together: module slices first, then by depth
    slices.sort(key=lambda e: (e["ts"], e["cat"] != "module", -e["dur"]))
    return {
        "traceEvents": events + slices,
        "displayTimeUnit": "ns",
        "otherData": {"producer": "torchlens", "model": history.model_name, "operations": len(ops)},
    }


def write_chrome_trace(history: Any, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace_events(history), f)
