"""The module-call graph of a model, read off one traced forward pass.

A *call* is one call of one module during a forward pass, identified as ``address:n`` (the
n-th call of that module in the pass; the model itself is ``""``). Inside a call, the graph has
one node per input and output of the call (``input 0``, ``output 0``) and one per call of a
child module; an edge means that data flows from some output of one node into some input of
another, possibly through plain tensor operations of the call's own ``forward``. A model that
calls itself makes one call (the tracer sees one pass): the inner calls' children are its own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ...trace.observe import PassObserver, PassRecords, observe_pass, tensors_in, tensors_in_call
from .compiled import named_modules


@dataclass
class Call:
    """One module call: where it sits, what goes in and out, and how its children connect."""

    id: str  # 'layer1.0:1'; the model itself is ''
    address: str
    class_name: str
    parent: Optional[str]
    children: List[str] = field(default_factory=list)
    inputs: List[Tuple[str, List[int]]] = field(default_factory=list)  # (name, shape) of the first pass
    outputs: List[Tuple[str, List[int]]] = field(default_factory=list)
    edges: List[Tuple[str, str]] = field(default_factory=list)  # node -> node, nodes named as above
    extra_repr: str = ""
    params: List[Tuple[str, List[int]]] = field(default_factory=list)
    attached: List[str] = field(default_factory=list)  # names given to tl.attach inside this call
    # extra_repr's parts as (name, value): positional parts named after the constructor's
    # parameters ('in_channels'), '-' where it names none; empty in runs written before
    arguments: List[Tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Call":
        d = dict(d)
        for key in ("inputs", "outputs", "params"):
            d[key] = [(name, list(shape)) for name, shape in d.get(key, [])]
        d["edges"] = [tuple(e) for e in d.get("edges", [])]
        d["arguments"] = [tuple(a) for a in d.get("arguments", [])]
        return cls(**d)


def call_id(address: str, n: int) -> str:
    return f"{address}:{n}" if address else ""


def position_name(position: Any) -> str:
    if isinstance(position, tuple):
        return ".".join(map(str, position))
    return str(position)


def input_tensors(args: tuple, kwargs: dict) -> List[Tuple[str, torch.Tensor]]:
    """``[('input 0', t), ('input attention_mask', m), ('input 1.0', nested)]``."""
    return [(f"input {position_name(p)}", t) for p, t in tensors_in_call(args, kwargs)]


def output_tensors(output: Any) -> List[Tuple[str, torch.Tensor]]:
    """``[('output 0', t)]`` for one tensor; tuple, list and dict outputs by position or key."""
    return [(f"output {position_name(p) if p != () else 0}", t) for p, t in tensors_in(output)]


def split_top_level(text: str) -> List[str]:
    """``'3, (1, 1), k=[1, 2]'`` -> ``['3', '(1, 1)', 'k=[1, 2]']``: commas inside brackets or
    quotes do not split.

    Example:
        >>> split_top_level("64, kernel_size=(3, 3), name='a,b'")
        ['64', 'kernel_size=(3, 3)', "name='a,b'"]
    """
    parts: List[str] = []
    current: List[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _positional_names(cls: type) -> List[str]:
    """The names a constructor takes by position, in order (none after ``*args``)."""
    import inspect

    try:
        signature = inspect.signature(cls.__init__)  # type: ignore[misc]
    except (TypeError, ValueError):  # a builtin or otherwise unreadable constructor
        return []
    names = []
    for p in list(signature.parameters.values())[1:]:  # [0] is self
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        names.append(p.name)
    return names


def named_arguments(module: nn.Module, extra_repr: str) -> List[Tuple[str, str]]:
    """``extra_repr``'s parts as ``(name, value)``: ``key=value`` parts by their key, the parts
    before them by the constructor's parameter at that position (``'-'`` if there is none).

    Example:
        >>> named_arguments(nn.Conv2d(3, 8, 1), "3, 8, kernel_size=(1, 1)")
        [('in_channels', '3'), ('out_channels', '8'), ('kernel_size', '(1, 1)')]
    """
    names = _positional_names(type(module))
    out, position = [], 0
    for part in split_top_level(extra_repr):
        key, sep, value = part.partition("=")
        if sep and key.strip().isidentifier():
            out.append((key.strip(), value.strip()))
            continue
        out.append((names[position] if position < len(names) else "-", part))
        position += 1
    return out


def module_info(module: nn.Module, address: str, n: int, parent: Optional[str]) -> Call:
    try:
        extra = module.extra_repr()
        arguments = named_arguments(module, extra)
    except Exception:  # a broken extra_repr (or signature) must not stop training
        extra, arguments = "", []
    params = [
        (name, list(p.shape))
        for name, p in module._parameters.items()
        if p is not None and not isinstance(p, nn.parameter.UninitializedParameter)
    ]
    return Call(
        call_id(address, n),
        address,
        type(module).__name__,
        parent,
        extra_repr=extra,
        params=params,
        arguments=arguments,
    )


class _CallRecorder(PassObserver):
    """Per-module hooks used during the metadata pass: which traced records enter and leave
    each call. Module hooks run after the tracer's global hooks, so they see its records."""

    def __init__(self, model: nn.Module) -> None:
        self.records: Optional[PassRecords] = None
        self.addresses = {id(m): a for a, m in named_modules(model)}  # compile wrappers left out
        self.calls: Dict[str, Call] = {}
        self.order: List[str] = []
        self.entries_in: Dict[str, List[Tuple[str, Any]]] = {}
        self.entries_out: Dict[str, List[Tuple[str, Any]]] = {}
        self.paths: Dict[str, tuple] = {}  # call id -> ((address, n), ...) below the model
        self.stack: List[str] = []
        self.counts: Dict[str, int] = {}
        self.nested_model_calls = 0
        self.handles: list = []
        for module in model.modules():
            self.handles.append(module.register_forward_pre_hook(self.pre_hook, with_kwargs=True))
            self.handles.append(module.register_forward_hook(self.post_hook, with_kwargs=True, always_call=True))

    def pass_started(self, records: PassRecords) -> None:
        self.records = records

    def pass_ended(self) -> None:
        self.records = None

    def record_of(self, tensor: torch.Tensor) -> Any:
        return self.records.record_of(tensor) if self.records is not None else None

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def current(self, module: nn.Module) -> Optional[str]:
        """The innermost running call of ``module``."""
        address = self.addresses.get(id(module))
        for cid in reversed(self.stack):
            if self.calls[cid].address == address:
                return cid
        return None

    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        address = self.addresses.get(id(module))
        if address is None:
            return
        if address == "" and self.stack:  # the model calling itself: the tracer sees one pass
            self.nested_model_calls += 1
            return
        n = self.counts.get(address, 0) + 1
        self.counts[address] = n
        parent = self.stack[-1] if self.stack else None
        call = module_info(module, address, n, parent)
        found = [(name, t) for name, t in input_tensors(args, kwargs)]
        call.inputs = [(name, list(t.shape)) for name, t in found]
        self.entries_in[call.id] = [(name, self.record_of(t)) for name, t in found]
        parent_path = self.paths[parent] if parent is not None else ()
        self.paths[call.id] = parent_path + ((address, n),) if address else ()
        self.calls[call.id] = call
        self.order.append(call.id)
        if parent is not None:
            self.calls[parent].children.append(call.id)
        self.stack.append(call.id)

    def post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        address = self.addresses.get(id(module))
        if address is None or not self.stack:
            return
        if address == "" and self.nested_model_calls:
            self.nested_model_calls -= 1
            return
        cid = self.stack.pop()
        found = output_tensors(output)
        self.calls[cid].outputs = [(name, list(t.shape)) for name, t in found]
        self.entries_out[cid] = [(name, self.record_of(t)) for name, t in found]


def trace_calls(model: nn.Module, args: tuple, kwargs: dict, on_attach: Optional[Callable] = None) -> Dict[str, Call]:
    """Run one traced forward pass (nothing saved) and return the calls, in call order.

    The pass leaves no trace in the model: buffers (BatchNorm statistics) are put back, the
    random number generators are restored by the tracer, and the inputs are deep copies where
    they can be copied (a stateful input object is then not advanced twice).
    """
    recorder = _CallRecorder(model)
    if on_attach is not None:
        on_attach(recorder)
    try:
        observe_pass(model, args, kwargs, recorder)
    finally:
        recorder.remove()
        if on_attach is not None:
            on_attach(None)
    _connect(recorder)
    return {cid: recorder.calls[cid] for cid in recorder.order}


def _connect(rec: _CallRecorder) -> None:
    """Fill ``edges`` of every call from the traced records' parents."""
    child_of_path = {path[-1]: cid for cid, path in rec.paths.items() if path}
    for cid in rec.order:
        call = rec.calls[cid]
        path = rec.paths[cid]
        depth = len(path)
        input_names: Dict[int, List[str]] = {}
        for name, e in rec.entries_in.get(cid, []):
            if e is not None:
                input_names.setdefault(id(e), []).append(name)
        memo: Dict[int, frozenset] = {}

        def sources(e, memo=memo, input_names=input_names, path=path, depth=depth) -> frozenset:
            """Nodes of this call that the record ``e`` comes from (iterative walk upwards)."""
            if e is None:
                return frozenset()
            start = e
            if id(start) in memo:
                return memo[id(start)]
            todo, seen, found = [e], set(), set()
            while todo:
                e = todo.pop()
                if id(e) in seen:
                    continue
                seen.add(id(e))
                names = input_names.get(id(e))
                stack = e.module_stack
                if names:
                    found.update(names)
                elif len(stack) > depth and stack[:depth] == path:
                    child = child_of_path.get(stack[depth])
                    if child is not None:
                        found.add(child)
                elif stack == path and e.kind == "op":
                    todo.extend(p for p, _ in e.parent_refs)
            result = frozenset(found)
            memo[id(start)] = result
            return result

        edges: Dict[Tuple[str, str], None] = {}
        for child in call.children:
            for _, e in rec.entries_in.get(child, []):
                for source in sorted(sources(e)):
                    if source != child:
                        edges[(source, child)] = None
        for name, e in rec.entries_out.get(cid, []):
            for source in sorted(sources(e)):
                edges[(source, name)] = None
        call.edges = list(edges)


__all__ = ["Call", "call_id", "input_tensors", "output_tensors", "position_name", "trace_calls", "module_info"]
