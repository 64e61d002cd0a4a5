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
    >>> lean = run_pass(model, (torch.ones(5, 3),), {}, SavePlan(), random_seed=0, tracer_type=LeanTracer)
    >>> signature(lean.records) == signature(full.records), [tuple(r.shape) for r in lean.records]
    (True, [(5, 3), (5, 4), (5, 4), (5, 4)])
"""

from __future__ import annotations

import sys
import threading
import weakref
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import torch
from torch import nn

from ..records.tensor_log import TensorLogEntry
from .args import nested_shape, tensors_in, tensors_in_call
from .modules import ModelInventory
from .ops import OpInfo
from .outputs import OUTPUT_PARENTS, POSITIONAL_OUTPUTS, head, is_out_position, matching_parents
from .save_plan import SavePlan
from .sites import KERNEL_FILES, run_kernel_call
from .tracer import Tracer

_get_ident = threading.get_ident
_Tensor = torch.Tensor
_ref = weakref.ref


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

    def __init__(self, raw_index: int, func: Callable, parent_refs: list, call_frames: tuple) -> None:
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
    """Records a pass like ``Tracer`` with metadata only (see the module docstring)."""

    def __init__(
        self, inventory: ModelInventory, plan: SavePlan, save_function_args: bool = False, save_gradients: bool = False
    ) -> None:
        if save_function_args or save_gradients or not plan.saves_nothing or plan.decompositions:
            raise ValueError(
                "LeanTracer records metadata only: a plan that saves nothing, without saved function arguments, "
                "gradients or decompositions. Use Tracer for the others."
            )
        if plan.intervention is not None or plan.write_watcher is not None or plan.memory is not None:
            raise ValueError("LeanTracer records metadata only: no interventions, write watchers or memory checks.")
        super().__init__(inventory, plan)

    # ----- the hot path: Tracer.on_call and _log_call in one frame, without what a lean pass
    # never does (decompositions, saved arguments, watchers, interventions, saving) -----------
    def on_call(self, func: Callable, info: OpInfo, args: tuple, kwargs: dict) -> Any:
        caller = sys._getframe(2)
        if KERNEL_FILES[caller.f_code.co_filename]:  # part of an operator's kernel (see sites.py)
            return run_kernel_call(func, args, kwargs)
        outermost = self.depth == 0
        if outermost:
            self.caller_frame = caller
            self.frames_cache = None
        self.depth += 1
        found = tensors_in_call(args, kwargs)
        if self.inventory.buffer_addresses:
            self._register_buffers(found)  # before the call, which may update them in place
        n_before = len(self.entries)
        try:
            start = perf_counter()
            if info.opaque:
                self.paused = True
                try:
                    out = func(*args, **kwargs)
                finally:
                    self.paused = False
            else:
                out = func(*args, **kwargs)
            elapsed = perf_counter() - start
        except BaseException:
            if self.error_context is None:
                self.error_context = self._describe_call(info.name)
            self.depth -= 1
            if outermost:
                self.caller_frame = None
            raise
        self.depth -= 1
        self.paused = True
        try:
            self._log_call(func, info, args, kwargs, found=found, out=out, elapsed=elapsed, n_before=n_before)
        finally:
            self.paused = False
            if outermost:
                self.caller_frame = None
        return out

    def _log_call(
        self, func, info: OpInfo, args, kwargs, found, out, elapsed: float, n_before: int, rng_state=None
    ) -> None:
        out_arg = kwargs.get("out") if kwargs else None
        if out_arg is not None:
            target = out_arg
            found = [(position, t) for position, t in found if not is_out_position(position)]
        elif info.is_inplace:
            target = args[0] if args else None
        else:
            target = out
        outputs = [(None, target)] if isinstance(target, _Tensor) else tensors_in(target)
        if not outputs:
            return
        entries = self.entries
        live = self.live
        if len(entries) > n_before:  # a composite function: its inner operations are logged already
            for _, t in outputs:
                known = live.get(id(t))
                if known is None or known[0]() is not t or known[1].raw_index < n_before:
                    break
            else:
                return
        parents: List[Tuple[TensorLogEntry, Any]] = []
        params: List[str] = []
        param_addresses = self.inventory.param_addresses
        for position, t in found:  # Tracer._inputs_of
            known = live.get(id(t))
            if known is not None and known[0]() is t:
                parents.append((known[1], position))
                continue
            address = param_addresses.get(id(t))
            if address is not None:
                if address not in params:
                    params.append(address)
            elif self.depth == 0 and self._is_untraced(t):
                parents.append((self.untraced(t, self._frames()), position))
        frames = self.frames_cache
        if frames is None:
            frames = self.frames_cache = self._innermost(self.caller_frame)
        condition, self.pending_condition = self.pending_condition, None
        positional = info.name in POSITIONAL_OUTPUTS
        output_rule = OUTPUT_PARENTS.get(info.name) if len(outputs) > 1 else None
        module_stack, used, inplace = self.module_stack, tuple(params), info.is_inplace
        for position, tensor in outputs:
            refs = matching_parents(parents, position) if positional else parents
            if output_rule is not None and head(position) in output_rule:
                allowed = output_rule[head(position)]
                refs = [(p, pos) for p, pos in refs if head(pos) in allowed]
            e = LeanRecord(len(entries), func, refs, frames)
            e.func_name = info.name
            e.param_addresses = used
            e.module_stack = module_stack
            e.elapsed = elapsed
            e.output_index = position
            e.branch_condition_record = condition
            # Tracer._describe_tensor and _add, inline
            e.shape = tensor.shape if not tensor.is_nested else nested_shape(tensor)
            e.dtype = tensor.dtype
            try:
                e.nbytes = tensor.nelement() * tensor.element_size()
            except Exception:  # sparse or otherwise unusual layouts
                e.nbytes = 0
            try:
                grad_fn = tensor.grad_fn
            except RuntimeError:  # see sites.grad_fn_of
                grad_fn = None
            e.grad_fn_name = type(grad_fn).__name__ if grad_fn is not None else None
            entries.append(e)  # type: ignore[arg-type]  # a LeanRecord stands for a TensorLogEntry here
            if id(tensor) not in param_addresses:
                live[id(tensor)] = (_ref(tensor), e)  # type: ignore[assignment]
        if inplace and isinstance(target, _Tensor) and target._base is not None:
            self._write_through(target, e, frames)  # type: ignore[arg-type]

    def _frames(self) -> tuple:
        """The innermost frame only (as ``((code, 0, offset),)``: its line is not read), which is
        the last of what ``Tracer`` records; the structure's records hold the whole stacks."""
        if self.frames_cache is None:
            self.frames_cache = self._innermost(self.caller_frame)
        return self.frames_cache

    def _innermost(self, frame: Any) -> tuple:
        stop, sites_of, code_sites = self.stack.stop_code, self.stack.sites_of, self.stack.code_sites
        while frame is not None and frame.f_code is not stop:
            code = frame.f_code
            known = code_sites.get(id(code))
            if (known[1] if known is not None else sites_of(code)) is not None:
                return ((code, 0, frame.f_lasti),)
            frame = frame.f_back
        return ()

    def _add(self, e: TensorLogEntry, tensor: torch.Tensor, track: bool) -> None:
        self._describe_tensor(e, tensor)
        self.entries.append(e)
        if track:
            self.live[id(tensor)] = (weakref.ref(tensor), e)

    def module_pre_hook(self, module: nn.Module, args: Any) -> None:
        # Tracer's, without counting the frames above weighted modules (only the grouping of
        # passes in post-processing reads them, and the structure has its groups)
        if self.paused or self.thread_id != _get_ident():
            return
        address = self.inventory.module_addresses.get(id(module))
        if not address:
            return
        n = self.module_pass_counts.get(address, 0) + 1
        self.module_pass_counts[address] = n
        self.module_frames.append((module, address, n, len(self.entries), self.module_stack))
        self.module_stack = self.module_stack + ((address, n),)


def signature(records: List[TensorLogEntry]) -> List[tuple]:
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


def first_difference(lean: List[tuple], traced: List[tuple]) -> Optional[Tuple[int, List[str]]]:
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
