"""Hand-built records for the post-processing unit tests (no model, no tracing).

``Records`` appends ``TensorLogEntry`` objects in execution order with the fields that capture
fills (``raw_index`` is the position in the list, as the tracer makes it). Call sites are plain
tuples: post-processing only slices ``call_frames`` and tells sites apart by identity, so
``site(line)`` stands for the tracer's ``((code, line, bytecode offset), ...)``, one tuple per
line and offset as the tracer's stack walker keeps them.
"""

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from torchlens.trace.records.tensor_log import TensorLogEntry

ModuleStack = Tuple[Tuple[str, int], ...]


_SITES: Dict[Tuple[int, int], tuple] = {}


def site(*lines: int, offset: int = 0) -> tuple:
    """A call stack of frames at ``lines`` (outermost first), each at bytecode ``offset``."""
    return tuple(_SITES.setdefault((line, offset), ("forward", line, offset)) for line in lines)


class Records:
    """The records of one hand-made pass, in execution order."""

    def __init__(self) -> None:
        self.entries: List[TensorLogEntry] = []

    def _new(
        self, kind: str, layer_type: str, func_name: str, parents: Sequence[TensorLogEntry] = (), func=None, **fields
    ) -> TensorLogEntry:
        e = TensorLogEntry(len(self.entries), kind, layer_type, func, func_name)
        e.parent_refs = [(p, position) for position, p in enumerate(parents)]
        for name, value in fields.items():
            setattr(e, name, value)  # __slots__: a misspelt field raises AttributeError
        self.entries.append(e)
        return e

    def input(self, name: str = "x") -> TensorLogEntry:
        return self._new("input", "input", "input", address=f"input.{name}")

    def buffer(self, address: str, modules: ModuleStack = ()) -> TensorLogEntry:
        return self._new("buffer", "buffer", "buffer", address=address, module_stack=modules)

    def untraced(self) -> TensorLogEntry:
        return self._new("untraced", "untraced", "untraced", untraced_reason="hand-made")

    def op(
        self,
        layer_type: str,
        *parents: TensorLogEntry,
        func_name: Optional[str] = None,
        params: Iterable[str] = (),
        modules: ModuleStack = (),
        frames: tuple = (),
        output_index=None,
        **fields,
    ) -> TensorLogEntry:
        return self._new(
            "op",
            layer_type,
            func_name or layer_type,
            parents,
            param_addresses=tuple(params),
            module_stack=tuple(modules),
            call_frames=frames,
            output_index=output_index,
            **fields,
        )

    def output(self, parent: Optional[TensorLogEntry], address: str = "output") -> TensorLogEntry:
        return self._new("output", "output", "output", [parent] if parent is not None else [], address=address)


def raw(entries: Iterable[TensorLogEntry]) -> List[int]:
    """Raw indices, for readable comparisons (entries compare by identity and print at length)."""
    return [e.raw_index for e in entries]


def layer_ids(layers: Iterable[Iterable[TensorLogEntry]]) -> List[List[int]]:
    return [raw(passes) for passes in layers]
