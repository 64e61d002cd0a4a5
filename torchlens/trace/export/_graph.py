"""What the graph exports share: each entry of a history as a node (its namespace of module
calls, its inputs among the kept entries, its parameters, shape, dtype and source line)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from ..records.func_call import FuncCallLocation

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


@dataclass
class Node:
    label: str
    kind: str  # 'op', 'input', 'output', 'buffer', 'untraced'
    layer_type: str  # 'conv2d', 'add', 'input', 'output', 'buffer'
    func: str  # the torch function's name ('conv2d', '__add__')
    scopes: List[str]  # the module calls it ran in, outermost first ('features', 'features.6')
    inputs: List[str]  # labels of its parents that the history kept, in argument order
    missing: List[str]  # labels of parents the history did not keep (layers_to_save)
    params: List[Tuple[str, Tuple[int, ...]]]  # (address, shape) of the parameters it used
    shape: Optional[Tuple[int, ...]]
    dtype: str  # 'float32'; '' when unknown
    module: str  # innermost module call ('' at the model's own level)
    source: str  # 'file.py:12' of the call in the model's code; '' when unknown
    code: str  # the source line of the call
    elapsed: float  # seconds the operation took (0.0 for inputs, outputs, buffers)
    address: str  # input/output/buffer address, or ''


def escape(segment: str) -> str:
    """A name made safe as one segment of a '/'-separated namespace."""
    return segment.replace("%", "%25").replace("/", "%2F")


def dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else ""


def _scope(entry: Any, address: str, pass_num: int) -> str:
    passes = (entry.module_passes or {}).get(address, 1)
    return address if passes == 1 else f"{address}:{pass_num}"


def _source(entry: Any) -> Tuple[str, str]:
    """``file:line`` and text of the innermost call in the model's code (outside torch): a
    conv2d's own innermost frame is torch's ``Conv2d.forward``; the line that called it tells more."""
    frames = [(code, line) for code, line, _ in entry.call_frames or ()]
    if not frames:
        return "", ""
    outside = [f for f in frames if not os.path.abspath(f[0].co_filename).startswith(_TORCH_DIR)]
    location = FuncCallLocation(*(outside or frames)[-1])
    try:
        text = location.code_line
    except (OSError, UnicodeDecodeError):  # a file gone or unreadable: the place still says where
        text = ""
    return f"{location.file}:{location.line_number}", text


def nodes_of(history: Any) -> List[Node]:
    """One ``Node`` per entry of ``history``, in execution order (parents before children)."""
    kept = {e.label for e in history.layer_list}
    param_info = getattr(history, "param_info", {}) or {}
    nodes = []
    for e in history.layer_list:
        positions = e.parent_arg_positions or {}
        parents = sorted(e.parent_layers or [], key=lambda p: min((_order(x) for x in positions.get(p) or [0])))
        source, code = _source(e)
        params = [(a, tuple(param_info[a][0]) if a in param_info else ()) for a in e.param_addresses or ()]
        nodes.append(
            Node(
                label=e.label,
                kind=e.kind,
                layer_type=e.layer_type or e.kind,
                func=e.func_name or e.layer_type or e.kind,
                scopes=[_scope(e, a, p) for a, p in e.module_stack],
                inputs=[p for p in parents if p in kept],
                missing=[p for p in parents if p not in kept],
                params=params,
                shape=tuple(int(s) for s in e.shape) if e.shape is not None else None,
                dtype=dtype_name(e.dtype),
                module=_scope(e, *e.module_stack[-1]) if e.module_stack else "",
                source=source,
                code=code,
                elapsed=float(e.elapsed or 0.0) if e.kind == "op" else 0.0,
                address=e.address or "",
            )
        )
    return nodes


def _order(position: Any) -> Tuple[int, Tuple[int, ...], str]:
    """Argument positions in call order: positional ones (``2``, ``(0, 1)`` inside a list
    argument) by index, then keyword arguments by name."""
    if isinstance(position, int):
        return (0, (position,), "")
    if isinstance(position, tuple) and all(isinstance(x, int) for x in position):
        return (0, position, "")
    return (1, (), str(position))
