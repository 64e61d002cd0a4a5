"""The state of one forward pass: turns each wrapped torch call into flat ``TensorLogEntry``s.

Hot path: ``Tracer.on_call`` runs for every torch call the model makes. It records only what
cannot be derived later (tensors in and out, parameters, module stack, call site, time) and
leaves labels, graph analysis and strings to post-processing.

Invariants the hot path relies on (break one and traces go subtly wrong, not loudly):

- *One wrapper code object.* Every wrapper made by ``decorate._make_wrapper`` shares one
  ``__code__`` (closures differ, code does not), so a call stack skips wrapper frames with one
  set lookup by id (``capture/stack.py``'s skip set: that code, ``on_call``'s, the opaque wrappers' codes and
  the tensor classes' call hook, capture/constructors.py). A wrapper
  written another way would show up as a frame of the model's source.
- *Frame depths.* ``on_call`` is entered from the wrapper, which is entered from the model's
  code: ``sys._getframe(2)`` in ``on_call`` is the caller's frame, and ``sys._getframe(1)`` in
  the module hooks is the hook's caller. Walking stops at ``run_model``'s frame
  (``capture/stack.py``), so frames of the user's script are never part of a ``func_call_stack``.
  Adding a Python layer between the wrapper and ``on_call`` shifts these numbers.
- *``depth`` vs ``paused``.* ``depth`` counts torch calls in progress. A call made while
  ``depth > 0`` runs inside another torch function (a composite such as ``F.layer_norm`` calling
  ``torch.layer_norm``) and is logged like any other; ``depth`` only tells ``on_bool`` and the
  untraced-tensor check that the model's own code is not the caller. ``paused`` switches
  logging off entirely: while the tracer itself works (``_log_call``, module hooks, copying) and
  while an opaque call (``torch.ops``, functorch) runs, so their insides never become nodes.
  Every place that sets ``paused`` resets it in a ``finally``.
- *The composite-function rule.* When a call returns, if every tensor it returns was made by
  an inner logged call (an entry at index ``n_before`` or later), the inner operations stand for
  it and it adds no entry; otherwise it is one operation whose parents are its own tensor
  arguments. So nested composites log their innermost operations, each once.
- *Identity of tensors.* Tensors are known by ``id`` with a weak reference checked on lookup
  (``live``), never by attributes set on them, so nothing outlives the pass on the tensor.
- *Old or new.* A tensor that reaches the model's own operation without a record is a
  constant if it existed when the pass began (``pass_start``, see ``capture/preexisting.py``:
  the collector's youngest generation tells), else an ``untraced`` node: made during the
  pass by a call torchlens does not log. Where the model holds a constant does not matter.
- *One thread.* Only the thread that started the pass is traced (``thread_id``); calls from
  other threads go straight to the original function.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
import weakref
from time import perf_counter
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..records.position import OpRngState, Position
from ..records.tensor_log import ParentRef, TensorLogEntry
from . import copy_on_write
from .args import Located, nested_shape, replace_tensors, tensors_in, tensors_in_call
from .constructors import CODES as CONSTRUCTOR_CODES
from .copy_on_write import SharedActivations
from .decorate import _make_wrapper, writes_in_place
from .gradients import record_gradient
from .hooks import Args, Call, Kwargs, PassHook, call_choosers, overriding
from .modules import ModelInventory
from .opaque import WRAPPER_CODES
from .ops import OpInfo
from .outputs import OUTPUT_PARENTS, POSITIONAL_OUTPUTS, Parents, dotted, head, is_out_position, matching_parents
from .preexisting import PassStart
from .save_plan import SavePlan
from .sites import KERNEL_FILES, grad_fn_of, raise_site, run_kernel_call
from .sites import rng_state as rng_state_now
from .stack import Site, StackWalker
from .unwrap import scripted_output

_Tensor = torch.Tensor
_get_ident = threading.get_ident

Frames = Tuple[Site, ...]  # a record's call_frames: (code, line, bytecode offset), outermost first
ModuleStack = Tuple[Tuple[str, int], ...]  # ((module address, pass), ...), outermost first
# a call of a module with parameters whose frame depth is not counted yet: (address, pass, its
# caller's frame)
PendingDepth = Optional[Tuple[str, int, types.FrameType]]
# (module, address, pass, records before it, the module stack outside it, the pending depth to
# restore when it returns: _NO_CHANGE for a call without parameters, which changes none)
ModuleFrame = Tuple[nn.Module, str, int, int, ModuleStack, Any]
_NO_CHANGE = object()


def write_through_view(
    base: torch.Tensor, value: torch.Tensor, size: Tuple[int, ...], stride: Tuple[int, ...], offset: int
) -> torch.Tensor:
    """``base`` after ``value`` was written into its view of ``size``/``stride`` at ``offset``
    elements from the base's start (the function of ``viewwrite`` layers)."""
    out = base.clone()
    out.as_strided(size, stride, out.storage_offset() + offset).copy_(value)
    return out


def empty_out(tensor: torch.Tensor) -> torch.Tensor:
    """A zero-element tensor with ``tensor``'s dtype and device: what saved function arguments
    hold in place of an ``out=`` tensor (torch resizes it without a warning)."""
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device)


def _nbytes(tensor: torch.Tensor) -> int:
    """The bytes of a tensor whose ``nbytes`` torch refuses (0 where its size is unknown too)."""
    try:
        return tensor.nelement() * tensor.element_size()
    except Exception:
        return 0


def identity(x: Any) -> Any:
    """The function of layers that pass a tensor on unchanged (outputs, ``nn.Identity``)."""
    return x


def _kept_buffers(inventory: ModelInventory) -> List[torch.Tensor]:
    """The model's buffers whose records stay uncopied until the pass ends, then copied together
    (on a GPU one launch for all instead of one each: copy_on_write.py): those a pass cannot
    update unseen, off the CPU. The others' records are copied when made."""
    buffers = inventory.buffers
    if copy_on_write.CPU_COPIES_AT_ONCE:
        buffers = [b for b in buffers if not b.is_cpu]
    if not buffers:
        return []
    unsafe = set(map(id, inventory.buffers_copied_at_once()))
    return [b for b in buffers if id(b) not in unsafe]


@functools.lru_cache(maxsize=None)
def _skip_code_ids() -> FrozenSet[int]:
    """Ids of the code of torchlens's own frames between the model and the tracer: every
    wrapper shares one code object, plus ``on_call`` and the opaque wrappers."""
    wrapper_code = _make_wrapper(identity, OpInfo("x", "x", False)).__code__
    return frozenset(map(id, (wrapper_code, Tracer.on_call.__code__, *WRAPPER_CODES, *CONSTRUCTOR_CODES)))


class Tracer:
    """Records one forward pass. Created, used and discarded by ``capture.run.run_pass``.

    A subclass records differently by overriding the small steps of the hot path (``_frames``,
    ``_new_op``, ``_add``, ``_note_frame_depth``): ``capture/lean.py`` is one. Features enter
    through ``hooks`` (``capture/hooks.py``), never by changing the tracer.
    """

    def __init__(self, inventory: ModelInventory, plan: SavePlan, hooks: Sequence[PassHook] = ()) -> None:
        self.thread_id = _get_ident()
        self.paused = False
        self.depth = 0
        self.inventory = inventory
        self.plan = plan
        self.save_all = plan.save_all
        self.save_function_args = plan.save_function_args
        self.save_gradients = plan.save_gradients
        self.hooks = tuple(hooks)
        # only what a hook overrides is called: an empty list costs the hot path one test
        self.choosers = call_choosers(self.hooks)  # function name -> before_call (decompositions)
        self.recorders = overriding(self.hooks, "on_record")  # e.g. interventions
        self.savers = overriding(self.hooks, "on_save")  # e.g. the memory check
        # tensor id -> what replaces it in the call's result (a recorder returned another tensor)
        self.substitutes: Dict[int, torch.Tensor] = {}
        self.shapes: Dict[torch.Size, torch.Size] = {}  # each distinct shape of the pass, once (_describe_tensor)
        # saved activations not copied until written (capture/shared.py); None: copy at once, or
        # nothing to copy (a plan that saves nothing: no storages to track, nothing to check after)
        share = plan.can_share and not plan.saves_nothing
        self.shared = (
            SharedActivations(inventory.parameters, inventory.buffers, _kept_buffers(inventory)) if share else None
        )
        # told before a logged call writes into a tensor (in place or out=): the copies above, the hooks
        self.write_watchers: List[Callable[[torch.Tensor], None]] = overriding(self.hooks, "before_write")
        if self.shared is not None:
            self.write_watchers.insert(0, self.shared.before_write)
        self.entries: List[TensorLogEntry] = []
        self.live: Dict[int, Tuple[weakref.ref[torch.Tensor], TensorLogEntry]] = {}
        # tensors known to have existed before the pass, id -> tensor: those held where constants
        # mostly live (module attributes, globals of the model's files: ``find_constants``, looked
        # at once, when the first tensor without a record arrives), or found by asking pass_start
        # (once per tensor). Only a tensor made during the pass by a call we do not log is a gap.
        self.known: Dict[int, torch.Tensor] = {}
        self.find_constants: Optional[Callable[[], Dict[int, torch.Tensor]]] = None  # set by run_pass
        self.pass_start: Optional[PassStart] = None  # set by run_pass
        self.parent_placeholders: List[ParentRef] = []
        self.module_stack: ModuleStack = ()
        self.module_frames: List[ModuleFrame] = []
        self.depth_pending: PendingDepth = None  # see _note_frame_depth
        self.module_pass_counts: Dict[str, int] = {}
        # (address, pass) -> how many call_frames lie above the module's forward
        self.module_frame_depths: Dict[Tuple[str, int], int] = {}
        # (address, pass) -> [(position in the module's output, record)], for keys like 'lstm:1.0'
        self.module_outputs: Dict[Tuple[str, int], List[Tuple[Any, TensorLogEntry]]] = {}
        self.caller_frame: Optional[types.FrameType] = None
        self.frames_cache: Optional[Frames] = None
        self.error_context: Optional[str] = None
        self.notes: List[str] = []  # for history.notes
        self.pending_condition: Optional[TensorLogEntry] = None
        # call stacks up to (not including) run_model's frame, without torchlens's own frames
        self.stack = StackWalker(Tracer.run_model.__code__, _skip_code_ids())

    # ----- running the model ----------------------------------------------------------------
    def run_model(self, model: nn.Module, args: Args, kwargs: Kwargs) -> Any:
        """Call the model. Frames above this one are not part of any ``func_call_stack``."""
        return model(*args, **kwargs)

    # ----- the hot path ----------------------------------------------------------------------
    def on_call(self, func: Call, info: OpInfo, args: Args, kwargs: Kwargs) -> Any:
        caller = sys._getframe(2)
        if KERNEL_FILES[caller.f_code.co_filename]:  # part of an operator's kernel (see sites.py)
            return run_kernel_call(func, args, kwargs)
        if self.choosers and info.name in self.choosers:  # e.g. capture/decompose.py
            for choose in self.choosers[info.name]:
                chosen = choose(info.name, func, args, kwargs)
                if chosen is not func:  # e.g. its math, whose torch calls are logged as the model's
                    return chosen(*args, **kwargs)
        outermost = self.depth == 0
        if outermost:
            self.caller_frame = caller
            self.frames_cache = None
        self.depth += 1
        found = tensors_in_call(args, kwargs)
        if self.inventory.buffer_addresses:
            self._register_buffers(found)  # before the call, which may update them in place
        n_before = len(self.entries)
        rng_state = None
        if self.save_function_args and info.is_random:
            rng_state = rng_state_now()  # so the operation can be replayed exactly
        if self.write_watchers and (info.may_write or (kwargs and "out" in kwargs)):
            self._before_write(args, kwargs, writes_in_place(info, args, kwargs))
        try:
            start = perf_counter()
            if info.opaque:  # one node: nothing inside is logged (see capture/opaque.py)
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
            self._log_call(
                func, info, args, kwargs, found=found, out=out, elapsed=elapsed, n_before=n_before, rng_state=rng_state
            )
        finally:
            self.paused = False
            if outermost:
                self.caller_frame = None
        if self.substitutes:
            out = self._substitute(out)  # the model goes on with the replaced value
        return out

    def _substitute(self, out: Any) -> Any:
        """``out`` with each tensor a recorder replaced swapped for its replacement."""
        substitutes, self.substitutes = self.substitutes, {}
        return replace_tensors(out, lambda t: substitutes.get(id(t), t))

    def _log_call(
        self,
        func: Call,
        info: OpInfo,
        args: Args,
        kwargs: Kwargs,
        found: Located,
        out: Any,
        elapsed: float,
        n_before: int,
        rng_state: Optional[OpRngState] = None,
    ) -> None:
        out_arg = kwargs.get("out") if kwargs else None
        if out_arg is not None:
            target = out_arg
            # the old value of an out= tensor is overwritten, never read: it is not a parent
            # (unless the same tensor is also passed as an input, at that input's position)
            found = [(position, t) for position, t in found if not is_out_position(position)]
        elif info.is_inplace:
            target = args[0] if args else None
        else:
            target = out
        outputs: List[Tuple[Any, torch.Tensor]]
        if isinstance(target, _Tensor):
            outputs = [(None, target)]
        else:
            outputs = tensors_in(target)
            if not outputs:
                return
        if len(self.entries) > n_before and self._made_inside(outputs, n_before):
            return  # a composite function: its inner operations are logged already
        parents, params = self._inputs_of(found)
        frames = self._frames()
        func_args = func_kwargs = None
        if self.save_function_args:
            func_args = replace_tensors(args, self._placeholder)
            func_kwargs = replace_tensors(kwargs, self._placeholder)
            if out_arg is not None:  # replays write into a fresh, empty tensor of the same kind
                func_kwargs["out"] = replace_tensors(out_arg, empty_out)
        inventory_params = self.inventory.param_addresses
        condition, self.pending_condition = self.pending_condition, None
        positional = info.name in POSITIONAL_OUTPUTS
        output_rule = OUTPUT_PARENTS.get(info.name) if len(outputs) > 1 else None
        for position, tensor in outputs:
            refs = matching_parents(parents, position) if positional else parents
            if output_rule is not None and head(position) in output_rule:
                allowed = output_rule[head(position)]
                refs = [(p, pos) for p, pos in refs if head(pos) in allowed]
            e = self._new_op(func, info, refs, frames)
            e.param_addresses = params
            e.module_stack = self.module_stack
            e.elapsed = elapsed
            e.is_inplace = info.is_inplace
            e.output_index = position
            e.func_args = func_args
            e.func_kwargs = func_kwargs
            e.branch_condition_record = condition
            e.rng_state = rng_state
            self._add(e, tensor, track=id(tensor) not in inventory_params)
        if info.is_inplace and isinstance(target, _Tensor) and target._base is not None:
            self._write_through(target, e, frames)

    def _new_op(self, func: Call, info: OpInfo, parent_refs: Parents, frames: Frames) -> TensorLogEntry:
        """The record of one output of a logged operation (its other fields are set by the caller)."""
        e = TensorLogEntry(len(self.entries), "op", info.layer_type, func, func_name=info.name)
        e.parent_refs = parent_refs
        e.call_frames = frames
        return e

    def _write_through(self, view: torch.Tensor, written: TensorLogEntry, frames: Frames) -> None:
        """An in-place operation on a view also changed its base tensor: give the base a new
        record, so later readers of the base see the write (``x[0].copy_(y)``; ``x`` changed)."""
        base: torch.Tensor = view._base  # type: ignore[assignment]  # the caller checked it is not None
        old = self.entry_of(base)
        if old is None:
            return
        e = TensorLogEntry(len(self.entries), "op", "viewwrite", write_through_view, func_name="write_through_view")
        e.parent_refs = [(old, 0), (written, 1)]
        e.module_stack = self.module_stack
        e.call_frames = frames
        if self.save_function_args:
            refs = (ParentRef(record=old), ParentRef(record=written))
            self.parent_placeholders.extend(refs)
            e.func_args = refs + (
                tuple(view.shape),
                tuple(view.stride()),
                view.storage_offset() - base.storage_offset(),
            )
            e.func_kwargs = {}
        self._add(e, base, track=True)

    def on_bool(self, tensor: torch.Tensor) -> None:
        """A tensor was converted to a Python bool by the model's code (``if``/``while``)."""
        if self.depth:
            return  # a torch function checking its own arguments, not the model's control flow
        e = self.entry_of(tensor)
        if e is not None:
            e.bool_used = True
            self.pending_condition = e

    # ----- helpers of the hot path -----------------------------------------------------------
    def _add(self, e: TensorLogEntry, tensor: torch.Tensor, track: bool) -> None:
        """Append a new record for ``tensor``: metadata, saved copy, gradient hook, tracking."""
        if self.recorders:
            original = tensor
            for on_record in self.recorders:
                tensor = on_record(e, tensor)
            if tensor is not original:  # what the call returns is replaced (see _substitute)
                self.substitutes[id(original)] = tensor
        self._describe_tensor(e, tensor)
        self.entries.append(e)
        if self.depth_pending is not None and not e.param_addresses and e.kind == "op":
            self._note_frame_depth()
        if self.save_all or self.plan.wants(e):
            e.activation = self._save(tensor, e)
        if self.save_gradients and tensor.requires_grad:
            record_gradient(tensor, e)
        if track:
            self.live[id(tensor)] = (weakref.ref(tensor), e)

    def _save(self, tensor: torch.Tensor, e: TensorLogEntry) -> Any:
        """The saved activation: the tensor itself while nothing writes into it, else a copy."""
        saved = None
        if self.shared is not None:
            saved = self.shared.keep(tensor, e, self.plan.detach)
        if saved is None:
            saved = self.plan.copy(tensor, e)
        for on_save in self.savers:
            on_save(e, saved)
        return saved

    def _before_write(self, args: Args, kwargs: Kwargs, inplace: bool) -> None:
        """An in-place or ``out=`` call is about to run: saved activations in its target's
        memory get their copies first (and the hooks watching writes are told)."""
        self.paused = True
        try:
            out = kwargs.get("out") if kwargs else None
            targets = [t for _, t in tensors_in(out)] if out is not None else []
            if inplace and args:
                targets.append(args[0])
            for before_write in self.write_watchers:
                for t in targets:
                    before_write(t)
        finally:
            self.paused = False

    def finish_sharing(self, held: List[torch.Tensor]) -> List[TensorLogEntry]:
        """After the pass: copy the saved activations in memory the caller or the model still
        holds (``held``); the entries whose memory changed unseen (then the pass is rerun)."""
        if self.shared is None:
            return []
        self.paused = True
        try:
            return self.shared.finish(held)
        finally:
            self.paused = False

    def entry_of(self, tensor: torch.Tensor) -> Optional[TensorLogEntry]:
        found = self.live.get(id(tensor))
        if found is not None and found[0]() is tensor:
            return found[1]
        return None

    def _made_inside(self, outputs: Sequence[Tuple[Any, torch.Tensor]], n_before: int) -> bool:
        for _, t in outputs:
            e = self.entry_of(t)
            if e is None or e.raw_index < n_before:
                return False
        return True

    def _register_buffers(self, found: Located) -> None:
        """Give buffers seen for the first time their buffer layer, holding their value now."""
        buffer_addresses = self.inventory.buffer_addresses
        for _, t in found:
            address = buffer_addresses.get(id(t))
            if address is not None and self.entry_of(t) is None:
                self.add_source(t, "buffer", address)

    def _inputs_of(self, found: Located) -> Tuple[Parents, Tuple[str, ...]]:
        parents: Parents = []
        params: List[str] = []
        param_addresses, live = self.inventory.param_addresses, self.live
        for position, t in found:
            held = live.get(id(t))  # entry_of, inlined: this runs for every argument of every call
            if held is not None and held[0]() is t:
                parents.append((held[1], position))
                continue
            address = param_addresses.get(id(t))
            if address is not None:
                if address not in params:
                    params.append(address)
            elif self.depth == 0 and self._is_untraced(t):
                parents.append((self.untraced(t, self._frames()), position))
            # a tensor older than the pass is a constant of it (e.g. a plain tensor attribute).
            # Inside another logged call (depth > 0) an unknown tensor is that call's own
            # business (a tensor subclass's inner values, a cached helper), not a gap in the model.
        return parents, tuple(params)

    def untraced(
        self,
        tensor: torch.Tensor,
        frames: Frames,
        parents: Sequence[Tuple[TensorLogEntry, Position]] = (),
        reason: str = "",
    ) -> TensorLogEntry:
        """A tensor without a record reached a logged operation, a module's output or the
        model's output, and it did not exist before the pass: a call torchlens does not wrap
        made it. It becomes an ``untraced`` node, so the gap is visible (and validation fails
        naming it) instead of its consumer silently losing a parent. ``parents``: what it is
        known to come from (a TorchScript submodule's inputs), with ``reason``."""
        grad_fn = grad_fn_of(tensor)
        if not reason and grad_fn is not None:
            reason = f"its grad_fn {type(grad_fn).__name__} was made by an operation torchlens did not log"
        elif not reason:
            reason = (
                "no logged operation made it, and it did not exist before the pass (it is not "
                "an input, parameter, buffer or constant of the model)"
            )
        e = TensorLogEntry(len(self.entries), "untraced", "untraced", None, func_name="untraced")
        e.untraced_reason = reason
        e.parent_refs = list(parents)
        e.module_stack = self.module_stack
        e.call_frames = frames
        self._add(e, tensor, track=True)
        return e

    def _is_untraced(self, tensor: torch.Tensor) -> bool:
        """Not recorded, not a parameter, and not a tensor that existed before the pass."""
        if id(tensor) in self.inventory.param_addresses or self.known.get(id(tensor)) is tensor:
            return False
        if self.find_constants is not None and self.pass_start is not None:
            # the first tensor of unknown age: take the constants where they mostly live, once
            # (those of them made during the pass by a call not logged are left out: gaps)
            found, self.find_constants = self.find_constants(), None
            self.known.update((id(t), t) for t in self.pass_start.existing(found.values()))
            if self.known.get(id(tensor)) is tensor:
                return False
        if self.pass_start is not None and self.pass_start.existed(tensor):
            self.known[id(tensor)] = tensor  # a constant: later uses need not ask again
            return False
        return True

    def _placeholder(self, tensor: torch.Tensor) -> Any:
        e = self.entry_of(tensor)
        if e is None:
            return tensor
        ref = ParentRef(record=e)
        self.parent_placeholders.append(ref)
        return ref

    def _frames(self) -> Frames:
        if self.frames_cache is None:  # on_call set caller_frame before any call comes here
            self.frames_cache = self.stack.walk(self.caller_frame)  # type: ignore[arg-type]
        return self.frames_cache

    def _describe_tensor(self, e: TensorLogEntry, tensor: torch.Tensor) -> None:
        if tensor.is_nested:
            e.shape = nested_shape(tensor)
        else:  # one object per distinct shape: a pass repeats few, and each one kept is the collector's to walk
            shape = tensor.shape
            e.shape = self.shapes.setdefault(shape, shape)
        e.dtype = tensor.dtype
        try:
            e.nbytes = tensor.nbytes
        except Exception:  # sparse or otherwise unusual layouts
            e.nbytes = _nbytes(tensor)
        try:  # sites.grad_fn_of, inlined: this runs for every record
            grad_fn = tensor.grad_fn
        except RuntimeError:
            grad_fn = None
        e.grad_fn_name = type(grad_fn).__name__ if grad_fn is not None else None

    def _describe_call(self, name: str) -> str:
        where = ""
        frames = self.stack.walk(self.caller_frame) if self.caller_frame is not None else ()
        if frames:
            code, line, _ = frames[-1]
            where = f", called at {code.co_filename}:{line} in {code.co_name}()"
        module = f" inside module '{self.module_stack[-1][0]}'" if self.module_stack else ""
        return f"while computing '{name}' (operation #{len(self.entries) + 1}){module}{where}"

    # ----- sources and sinks -----------------------------------------------------------------
    def add_source(self, tensor: torch.Tensor, kind: str, address: str) -> TensorLogEntry:
        """An input or buffer layer: a tensor that enters the graph without an operation."""
        self.paused = True
        try:
            e = TensorLogEntry(len(self.entries), kind, kind, None, func_name=kind)
            e.address = address
            e.module_stack = self.module_stack if kind == "buffer" else ()
            self._add(e, tensor, track=True)
            return e
        finally:
            self.paused = False

    def add_inputs(self, named_inputs: List[Tuple[str, Any]]) -> None:
        for name, value in named_inputs:
            for position, tensor in tensors_in(value):
                if self.entry_of(tensor) is None:
                    self.add_source(tensor, "input", f"input.{name}{dotted(position)}")

    def add_outputs(self, output: Any) -> None:
        try:
            self._register_buffers(tensors_in(output))
            self.paused = True
            for position, tensor in tensors_in(output):
                parent = self.entry_of(tensor)
                if parent is None and self._is_untraced(tensor):
                    parent = self.untraced(tensor, ())
                e = TensorLogEntry(len(self.entries), "output", "output", identity, func_name="output")
                e.parent_refs = [(parent, 0)] if parent is not None else []
                e.address = "output" + dotted(position)
                self._save_passed_on(e, parent, tensor)
                self._add(e, tensor, track=False)
        finally:
            self.paused = False

    def mark_buffer_writes(self) -> None:
        """Note the buffer address on operations whose result the model stored as a buffer."""
        module_addresses = self.inventory.module_addresses
        for module in self.inventory.modules:
            prefix = module_addresses[id(module)]
            for name, buffer in module._buffers.items():
                e = self.entry_of(buffer) if buffer is not None else None
                if e is not None and e.kind == "op":
                    e.stored_as_buffer = f"{prefix}.{name}" if prefix else name

    # ----- module hooks ----------------------------------------------------------------------
    def module_pre_hook(self, module: nn.Module, args: Any) -> None:
        if self.paused or self.thread_id != _get_ident():
            return
        address = self.inventory.module_addresses.get(id(module))
        if not address:  # not part of the model, or the model itself
            return
        n = self.module_pass_counts.get(address, 0) + 1
        self.module_pass_counts[address] = n
        restore: Any
        if address in self.inventory.weighted_modules:  # its caller's frame is alive while it runs
            restore, self.depth_pending = self.depth_pending, (address, n, sys._getframe(1))
        else:
            restore = _NO_CHANGE
        self.module_frames.append((module, address, n, len(self.entries), self.module_stack, restore))
        self.module_stack = self.module_stack + ((address, n),)

    def _note_frame_depth(self) -> None:
        """An operation without parameters was recorded inside a call of a module with
        parameters whose frame depth is not counted yet (``depth_pending``, the innermost such
        call): count how many call frames lie above its forward, from where recurrence detection
        keys its call site (post-processing's group_passes). Counted once per call, and only for
        the calls that need it (not for every convolution's)."""
        address, n, caller = self.depth_pending  # type: ignore[misc]  # the caller checked it is set
        self.module_frame_depths[(address, n)] = self.stack.count(caller)
        self.depth_pending = None

    def module_post_hook(self, module: nn.Module, args: Any, output: Any) -> Any:
        """None, or the module's output with the tensors a recorder replaced swapped (a forward
        hook's return value replaces the output)."""
        if self.paused or self.thread_id != _get_ident():
            return
        if not self.module_frames or self.module_frames[-1][0] is not module:
            return
        _, address, n, start, outer_stack, restore = self.module_frames.pop()
        if restore is not _NO_CHANGE:
            self.depth_pending = restore  # the enclosing call's with parameters, as when this one began
        if output is None and self.error_context is None and sys.exc_info()[1] is not None:
            # an always-called hook during an exception: the module's forward raised (the error
            # is not None: tested above)
            self.error_context = f"inside module '{address}'" + raise_site(sys.exc_info()[1])  # type: ignore[arg-type]
        self.paused = True
        try:
            for position, tensor in tensors_in(output):
                e = self.entry_of(tensor)
                if e is None and self._is_untraced(tensor):  # made inside by a call not logged
                    e = self.untraced(
                        tensor, self.stack.walk(sys._getframe(1)), *scripted_output(module, args, self.entry_of)
                    )
                elif e is None or e.raw_index < start:
                    e = self._pass_through(tensor, e)
                e.output_of_modules.append((address, n))
                self.module_outputs.setdefault((address, n), []).append((position, e))
                if e.activation is None and self.plan.wants_module(address, n):
                    e.activation = self._save(tensor, e)
            if self.substitutes:
                return self._substitute(output)  # a pass-through module's output was replaced
        finally:
            self.module_stack = outer_stack
            self.paused = False

    def _pass_through(self, tensor: torch.Tensor, parent: Optional[TensorLogEntry]) -> TensorLogEntry:
        """A module returned a tensor it did not compute (``nn.Identity``): give it its own node."""
        frames = self.stack.walk(sys._getframe(2))
        e = TensorLogEntry(len(self.entries), "op", "identity", identity, func_name="identity")
        e.parent_refs = [(parent, 0)] if parent is not None else []
        e.module_stack = self.module_stack
        e.call_frames = frames
        self._save_passed_on(e, parent, tensor)
        self._add(e, tensor, track=id(tensor) not in self.inventory.param_addresses)
        return e

    def _save_passed_on(self, e: TensorLogEntry, parent: Optional[TensorLogEntry], tensor: torch.Tensor) -> None:
        """With ``save_function_args``, a pass-through's saved call is ``identity(what it passed
        on)``: its parent, or a tensor that is no layer (a returned parameter or constant), kept
        as any operation keeps such an argument. Replays (validation, ``rerun``) then check and
        recompute it like any operation, and an edge lost after capture stays visible."""
        if not self.save_function_args:
            return
        if parent is not None:
            ref = ParentRef(record=parent)
            self.parent_placeholders.append(ref)
            e.func_args = (ref,)
        else:
            e.func_args = (tensor,)
        e.func_kwargs = {}


__all__ = ["Tracer", "identity"]
