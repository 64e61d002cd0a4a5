"""A decode step recorded leanly (``capture/lean.py``) made into a ``ModelHistory``: the traced
step of its key gives the structure (labels, edges, module boxes, source lines, parameters,
lookups), the lean pass gives each entry's shape, dtype, size, ``grad_fn`` and time.

The two passes must agree first: the same module calls in the same order, and the same records
(``capture.lean.signature``: function, parents, parameters, module stack, call site ... of each).
A step that ran differently raises ``StepStructureError``. It cannot fall back to tracing the
step again: the forward has run (the KV cache holds its keys and values, sampling drew its
numbers), and running it a second time would change what ``generate`` produces.
"""

from __future__ import annotations

import copy
import dataclasses
from time import perf_counter
from typing import Any, Callable, Dict, List

from ..capture import PassResult, describe, first_difference, signature
from ..history.model_history import ModelHistory
from ..records.tensor_log import TensorLogEntry
from .errors import StepStructureError

_SLOTS = tuple(name for name in TensorLogEntry.__slots__ if name != "__weakref__")


def _make_clone() -> Callable[[TensorLogEntry], TensorLogEntry]:
    """One straight-line function copying every field (``copy.copy`` of a record with 50 slots
    goes through ``__reduce_ex__``: 8 us, a tenth of a small decode step's whole budget)."""
    lines = "\n".join(f"    n.{name} = e.{name}" for name in _SLOTS)
    source = f"def clone(e):\n    n = new(cls)\n{lines}\n    return n\n"
    namespace: Dict[str, Any] = {"new": TensorLogEntry.__new__, "cls": TensorLogEntry}
    exec(source, namespace)  # noqa: S102 - source built above from the field names only
    return namespace["clone"]


clone_entry = _make_clone()


class Structure:
    """What a traced step leaves for the lean steps of its key: its raw records and their
    signature, its module calls, and (once post-processed, ``set_history``) its history."""

    def __init__(self, index: int, result: PassResult, calls: List[str]) -> None:
        self.index = index
        self.records = result.records
        self.signature = signature(result.records)  # before post-processing drops the parents
        self.calls = calls
        self.history: Any = None
        self.raw: List[int] = []  # raw index of each entry of the history
        self.keys: List[Any] = []  # the lookup's keys, in order ...
        self.sources: List[int] = []  # ... and what each names: an entry's position, or past them an ambiguity
        self.ambiguous: List[Any] = []

    def set_history(self, history: ModelHistory) -> None:
        self.history = history
        entries = history.layer_list
        self.raw = [e.raw_index for e in entries]
        position = {id(e): i for i, e in enumerate(entries)}
        for key, found in history._lookup.items():
            self.keys.append(key)
            if id(found) in position:
                self.sources.append(position[id(found)])
            else:  # an ambiguity holds labels only: shared by the steps
                self.sources.append(len(entries) + len(self.ambiguous))
                self.ambiguous.append(found)


def calls_differ(index: int, template_index: int, calls: List[str], expected: List[str]) -> StepStructureError:
    """The error for a step whose module calls differ from those of the step it reuses."""
    at = next((i for i, (a, b) in enumerate(zip(calls, expected)) if a != b), min(len(calls), len(expected)))
    return StepStructureError(
        f"log_generate: step {index} called the model's modules differently from step {template_index}, whose "
        f"structure it reuses (module call #{at + 1}: {calls[at] if at < len(calls) else 'none'!r} instead of "
        f"{expected[at] if at < len(expected) else 'none'!r}). Pass reuse_structure=False to trace every step fully."
    )


def check(index: int, structure: Structure, result: PassResult, calls: List[str]) -> None:
    """Raise ``StepStructureError`` unless the lean pass ran as the traced one did."""
    if calls != structure.calls:
        raise calls_differ(index, structure.index, calls, structure.calls)
    found = first_difference(signature(result.records), structure.signature)
    if found is None:
        return
    at, fields = found
    ran = describe(result.records[at]) if at < len(result.records) else "nothing"
    expected = describe(structure.records[at]) if at < len(structure.records) else "nothing"
    raise StepStructureError(
        f"log_generate: step {index} ran different operations from step {structure.index} (same input shapes), whose "
        f"structure it reuses: operation #{at + 1} was {ran} instead of {expected} (they differ in: "
        f"{', '.join(fields)}). Pass reuse_structure=False to trace every operation of every step."
    )


def lean_history(structure: Structure, result: PassResult, start: float) -> ModelHistory:
    """The structure's history with the lean pass's metadata (the two were checked to agree)."""
    template: ModelHistory = structure.history
    records = result.records
    entries: List[TensorLogEntry] = []
    for e, raw in zip(template.layer_list, structure.raw):
        r = records[raw]
        new = clone_entry(e)
        new.shape, new.dtype, new.nbytes, new.grad_fn_name, new.elapsed = (
            r.shape,
            r.dtype,
            r.nbytes,
            r.grad_fn_name,
            r.elapsed,
        )
        entries.append(new)
    # the template's keys, in their order, naming the new entries
    found = map((entries + structure.ambiguous).__getitem__, structure.sources)
    history = copy.copy(template)
    history.replace_entries(entries, dict(zip(structure.keys, found)))
    # of the whole pass, as a full trace's: only the bytes differ between steps of one structure
    history.pass_stats = dataclasses.replace(template.pass_stats, tensor_bytes=sum([e.nbytes or 0 for e in entries]))
    history.random_seed = result.random_seed
    history.pass_time = result.elapsed
    history.notes = list(result.notes)
    history.postprocess_time = perf_counter() - start
    return history


__all__ = ["Structure", "check", "lean_history", "calls_differ", "clone_entry"]
