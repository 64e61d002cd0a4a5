"""A lean tracer for a pass whose structure a traced pass already gave (``log_generate``'s decode
steps after the first of each input shape), when only metadata is asked for.

``LeanTracer`` is the ``Tracer`` (the same wrappers, the same rules for which calls become
records, in the same order: composites, buffers on first use, inputs, outputs, pass-throughs,
writes through views, untraced tensors) minus what the structure already holds: it walks no
call stacks (it notes only the innermost call site, to compare), counts no frames above module
calls, saves nothing and copies nothing. Its records carry what can differ between passes of
one structure: each tensor's shape, dtype, size, ``grad_fn`` and the call's time.

``signature(records)`` is what both passes must share for the traced pass's structure (labels,
edges, module boxes, source lines) to be this pass's too: per record its kind, function,
parents with their argument positions, parameters, module stack, output position, address,
innermost call site, the modules it was an output of and the branch it decided.

Example:
    >>> import torch
    >>> from torchlens.trace.capture.run import run_pass
    >>> from torchlens.trace.capture.save_plan import SavePlan
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    >>> full = run_pass(model, (torch.ones(2, 3),), {}, SavePlan(), random_seed=0)
    >>> lean = run_pass(model, (torch.ones(5, 3),), {}, SavePlan(), random_seed=0, lean=True)
    >>> signature(lean.records) == signature(full.records), [tuple(r.shape) for r in lean.records]
    (True, [(5, 3), (5, 4), (5, 4), (5, 4)])
"""

from __future__ import annotations

import types
import weakref
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

import torch

from ..records.tensor_log import TensorLogEntry
from .hooks import Call, PassHook, overriding
from .modules import ModelInventory
from .ops import OpInfo
from .outputs import Parents
from .save_plan import SavePlan
from .tracer import Frames, Tracer

Signature = Tuple[Any, ...]  # one record's fields that the structure shares (see ``signature``)


class LeanRecord:
    """A lean pass's record of one operation's output: the fields of a ``TensorLogEntry`` that
    the tracer's rules, ``signature`` and the step's history read (made per operation: a third
    of the time of a ``TensorLogEntry``, which sets all of its 50 fields)."""

    __slots__ = (
        "raw_index",
        "kind",
        "func",
        "func_name",
        "parent_refs",
        "call_frames",
        "param_addresses",
        "module_stack",
        "elapsed",
        "output_index",
        "branch_condition_record",
        "shape",
        "dtype",
        "nbytes",
        "grad_fn_name",
        "output_of_modules",
        "activation",
        "address",
        "bool_used",
        "stored_as_buffer",
        "untraced_reason",
        "is_inplace",
        "func_args",
        "func_kwargs",
        "rng_state",
    )

    if TYPE_CHECKING:  # set by the tracer after __init__
        func_name: str
        param_addresses: Tuple[str, ...]
        module_stack: Tuple[Tuple[str, int], ...]
        elapsed: float
        output_index: Any
        branch_condition_record: Any
        shape: Any
        dtype: Optional[torch.dtype]
        nbytes: int
        grad_fn_name: Optional[str]

    def __init__(self, raw_index: int, func: Call, parent_refs: Parents, call_frames: Frames) -> None:
        self.raw_index = raw_index
        self.kind = "op"
        self.func = func
        self.parent_refs = parent_refs
        self.call_frames = call_frames
        self.output_of_modules: List[Tuple[str, int]] = []
        self.activation = None
        self.address = None
        self.bool_used = False
        self.stored_as_buffer: Optional[str] = None
        self.untraced_reason = None


class LeanTracer(Tracer):
    """Records a pass like ``Tracer`` with metadata only (see the module docstring): the same hot
    path, with the steps that would walk stacks, count frames or save overridden."""

    def __init__(self, inventory: ModelInventory, plan: SavePlan, hooks: Sequence[PassHook] = ()) -> None:
        if plan.save_function_args or plan.save_gradients or not plan.saves_nothing:
            raise ValueError(
                "LeanTracer records metadata only: a plan that saves nothing, without saved function arguments "
                "or gradients. Use Tracer for the others."
            )
        if any(overriding(hooks, step) for step in ("before_call", "before_write", "on_record", "on_save")):
            raise ValueError(
                "LeanTracer records metadata only: its hooks may only listen (pass_started, pass_ended); "
                "decompositions, interventions, write watchers and memory checks need Tracer."
            )
        super().__init__(inventory, plan, hooks)

    def _new_op(self, func: Call, info: OpInfo, parent_refs: Parents, frames: Frames) -> TensorLogEntry:
        e = LeanRecord(len(self.entries), func, parent_refs, frames)
        e.func_name = info.name
        return e  # type: ignore[return-value]  # a LeanRecord stands for a TensorLogEntry here

    def _frames(self) -> Frames:
        """The innermost frame only (as ``((code, 0, offset),)``: its line is not read), which is
        the last of what ``Tracer`` records; the structure's records hold the whole stacks."""
        if self.frames_cache is None:
            self.frames_cache = self._innermost(self.caller_frame)
        return self.frames_cache

    def _innermost(self, frame: Optional[types.FrameType]) -> Frames:
        innermost = self.stack.innermost(frame)
        if innermost is not None:
            return ((innermost.f_code, 0, innermost.f_lasti),)
        return ()

    def _add(self, e: TensorLogEntry, tensor: torch.Tensor, track: bool) -> None:
        self._describe_tensor(e, tensor)
        self.entries.append(e)
        if track:
            self.live[id(tensor)] = (weakref.ref(tensor), e)

    def _note_frame_depth(self) -> None:
        """Not counted: only the grouping of passes in post-processing reads it, and the
        structure has its groups."""


def signature(records: List[TensorLogEntry]) -> List[Signature]:
    """Per record, what identifies it in the structure (see the module docstring). Read before
    post-processing, which drops the records' parents."""
    return [
        (
            e.kind,
            e.func,
            tuple([(p.raw_index, position) for p, position in e.parent_refs]),
            e.param_addresses,
            e.module_stack,
            e.output_index,
            e.address,
            (e.call_frames[-1][0], e.call_frames[-1][2]) if e.call_frames else None,  # code, offset
            tuple(e.output_of_modules),
            e.bool_used,
            e.branch_condition_record.raw_index if e.branch_condition_record is not None else None,
            e.stored_as_buffer,
            e.untraced_reason,
        )
        for e in records
    ]


_FIELDS = (
    "kind",
    "function",
    "parents",
    "parameters",
    "module stack",
    "output position",
    "address",
    "call site",
    "module outputs",
    "bool use",
    "branch condition",
    "buffer it is stored as",
    "untraced reason",
)


def first_difference(lean: List[Signature], traced: List[Signature]) -> Optional[Tuple[int, List[str]]]:
    """The first record where two signatures differ and what differs there, or None if equal."""
    if lean == traced:
        return None
    for i, (a, b) in enumerate(zip(lean, traced)):
        if a != b:
            return i, [name for name, x, y in zip(_FIELDS, a, b) if x != y]
    if len(lean) != len(traced):
        return min(len(lean), len(traced)), ["number of operations"]
    return None


def describe(e: TensorLogEntry) -> str:
    """``'linear' inside 'transformer.h.0.mlp' (modeling_gpt2.py, in forward)``, for messages."""
    text = repr(e.func_name)
    if e.module_stack:
        text += f" inside {e.module_stack[-1][0]!r}"
    if e.call_frames:
        code = e.call_frames[-1][0]
        text += f" ({code.co_filename.rsplit('/', 1)[-1]}, in {code.co_name})"
    return text


__all__ = ["LeanTracer", "signature", "first_difference", "describe"]
