"""One traced forward pass: install everything, run the model, and put everything back."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ...collector import automatic_collection_paused
from ...errors import TorchlensError
from ..records.tensor_log import ParentRef, TensorLogEntry
from . import decorate, ops
from .args import tensors_in, tensors_in_call
from .bound import BoundReferences
from .hooks import Args, Kwargs, PassHook, PassRecords
from .lean import LeanTracer
from .memory import ActivationMemoryWarning
from .meta import active_modes, data_dependent_error, is_value_error, lost_op_notes, meta_note
from .modules import LazyInitialisation, ModelInventory, ModelState, held_constants, tensors_held
from .preexisting import PassStart
from .rng import RngState, seed_everything
from .save_plan import SavePlan, has_torchlens_note
from .tracer import Tracer

_PASS_LOCK = threading.Lock()


@dataclass
class PassResult:
    """What a pass hands to post-processing: plain data, the tracer itself is gone."""

    records: List[TensorLogEntry]  # every record, in the order made
    parent_refs: List[ParentRef]  # the placeholders in saved arguments, still naming records
    module_pass_counts: Dict[str, int]
    module_frame_depths: Dict[Tuple[str, int], int]  # (address, pass) -> frames above its forward
    module_outputs: Dict[Tuple[str, int], List[Tuple[Any, TensorLogEntry]]]  # for keys like 'lstm:1.0'
    notes: List[str]
    save_gradients: bool
    inventory: ModelInventory
    model_name: str
    random_seed: int
    elapsed: float
    output: Any = None  # what the model returned (the pass's caller decides whether to keep it)
    code_ids: FrozenSet[int] = frozenset()  # ids of every code a call stack passed through (all alive)

    @classmethod
    def of(cls, tracer: Tracer, *, model_name: str, random_seed: int, elapsed: float, output: Any) -> "PassResult":
        return cls(
            records=tracer.entries,
            parent_refs=tracer.parent_placeholders,
            module_pass_counts=tracer.module_pass_counts,
            module_frame_depths=tracer.module_frame_depths,
            module_outputs=tracer.module_outputs,
            notes=tracer.notes,
            save_gradients=tracer.save_gradients,
            inventory=tracer.inventory,
            model_name=model_name,
            random_seed=random_seed,
            elapsed=elapsed,
            output=output,
            code_ids=frozenset(tracer.stack.sites),
        )


@functools.lru_cache(maxsize=256)
def _forward_signature(forward_function: Any) -> inspect.Signature:
    signature = inspect.signature(forward_function)
    params = list(signature.parameters.values())
    if params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        params = params[1:]  # self
    return signature.replace(parameters=params)


def named_inputs(model: nn.Module, args: Args, kwargs: Kwargs) -> List[Tuple[str, Any]]:
    """Input values named after the parameters of ``forward`` (``x``, ``mask``) where possible."""
    try:
        forward = model.forward
        if getattr(forward, "__self__", None) is model and hasattr(forward, "__func__"):
            signature = _forward_signature(forward.__func__)
        else:
            signature = inspect.signature(forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return [(str(i), a) for i, a in enumerate(args)] + list(kwargs.items())
    named: List[Tuple[str, Any]] = []
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.extend(value.items())
        else:
            named.append((name, value))
    return named


class CudaGraphCaptureError(TorchlensError, RuntimeError):
    """A pass was asked for while a CUDA graph was being captured on the current stream.

    A trace copies activations and reads what it records; inside a capture those reads are
    recorded into the graph instead of happening, so the log would describe nothing real.
    Trace the forward outside ``torch.cuda.graph(...)`` (a graph replays what was captured
    without running Python, so it could not be traced anyway)."""


def check_not_capturing() -> None:
    """Refuse a trace while the current CUDA stream is capturing a graph (``CudaGraphCaptureError``)."""
    # only where CUDA is initialised: asking otherwise would start a CUDA context for a CPU model
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        raise CudaGraphCaptureError(
            "torchlens: a forward cannot be traced while a CUDA graph is being captured "
            "(torch.cuda.graph / make_graphed_callables): the trace's copies and reads would be "
            "recorded into the graph instead of running. Trace the model outside the capture."
        )


def _check_not_nested() -> None:
    check_not_capturing()
    active = ops.ACTIVE.tracer
    if active is not None and active.thread_id == threading.get_ident():
        raise RuntimeError(
            "torchlens: log_forward_pass was called while a forward pass is already being "
            "logged in this thread (from inside the model or a torchlens callback). Run the "
            "second pass after the first one returns."
        )


def run_pass(
    model: nn.Module,
    args: Args,
    kwargs: Kwargs,
    plan: SavePlan,
    *,
    random_seed: Union[int, RngState],
    hooks: Sequence[PassHook] = (),
    lean: bool = False,
    session: Optional["PassSession"] = None,
) -> PassResult:
    """Run ``model(*args, **kwargs)`` once with the decorator layer installed and torch and the
    model put back afterwards. ``plan``: what to save; ``random_seed`` seeds the generators, or is
    the ``RngState`` they start from; ``hooks``: the features that enter the pass
    (``capture/hooks.py``); ``lean``: record metadata only, for a pass of known structure
    (``capture/lean.py``); ``session``: what passes on the same model share (``PassSession``).

    Example:
        >>> result = run_pass(nn.Linear(2, 2), (torch.ones(1, 2),), {}, SavePlan(save_all=True), random_seed=0)
        >>> [r.layer_type for r in result.records], tuple(result.output.shape)
        (['input', 'linear', 'output'], (1, 2))
    """
    _check_not_nested()
    with _PASS_LOCK, automatic_collection_paused():  # see collector.py
        inventory = session.inventory_of(model) if session is not None else ModelInventory.of(model)
        tracer = (LeanTracer if lean else Tracer)(inventory, plan, hooks)
        versions = None
        if tracer.shared is not None:  # to know whether a rerun would start where this pass did
            watched = inventory.buffers + [t for _, t in tensors_in_call(args, kwargs)]
            versions = (watched, _versions(watched))
        modes = active_modes()  # the caller's modes, before the hooks enter theirs: noted after the pass
        start = perf_counter()
        with _installed(model, tracer, random_seed, session):
            output, stale = _run_model(model, args, kwargs, tracer, modes=modes)
        elapsed = perf_counter() - start
    if stale:
        plan.copy_at_once = True
        return _rerun_copying(
            model, (args, kwargs), plan, stale, versions=versions, random_seed=random_seed, hooks=hooks, session=session
        )
    seed = random_seed if isinstance(random_seed, int) else -1  # -1: it started from given generator states
    output = output if plan.hands_out_output else None
    return PassResult.of(tracer, model_name=type(model).__name__, random_seed=seed, elapsed=elapsed, output=output)


@contextlib.contextmanager
def _installed(
    model: nn.Module, tracer: Tracer, random_seed: Union[int, RngState], session: Optional["PassSession"]
) -> Iterator[None]:
    """Torch patched, the module hooks registered and the pass's hooks started; on the way out
    everything put back (wrappers, hooks, the model's flags, the caller's generators)."""
    table = decorate.current_wrapper_table()
    inventory = tracer.inventory
    state = ModelState.of(model, inventory)
    rng = RngState()
    lazy = LazyInitialisation(model, tracer, rng) if inventory.has_lazy else None
    if session is not None:
        bound_refs = session.bound_references(table, model, inventory)
    else:
        bound_refs = BoundReferences(table, model, inventory.modules)
    handles = []
    started: List[PassHook] = []
    # after this, a tensor without a record that is new is a gap; an old one is a constant
    tracer.pass_start = PassStart()
    try:
        seed_everything(random_seed)
        ops.install(table)
        bound_refs.install()
        tracer.find_constants = functools.partial(held_constants, inventory.modules, bound_refs.global_namespaces)
        handles.append(nn.modules.module.register_module_forward_pre_hook(tracer.module_pre_hook))
        handles.append(nn.modules.module.register_module_forward_hook(tracer.module_post_hook, always_call=True))
        ops.ACTIVE.tracer = tracer
        records = PassRecords(tracer)
        for hook in tracer.hooks:
            hook.pass_started(records)
            started.append(hook)
        yield
    finally:
        for hook in started:
            hook.pass_ended()
        tracer.pass_start.end()
        tracer.stack.forget()
        tracer.module_frames.clear()  # calls a raising forward left open hold their callers' frames
        tracer.depth_pending = None
        if lazy is not None:
            lazy.remove()
        ops.ACTIVE.tracer = None
        for handle in handles:
            handle.remove()
        bound_refs.uninstall()
        ops.uninstall(table)
        state.restore()
        rng.restore()


def _run_model(
    model: nn.Module, args: Args, kwargs: Kwargs, tracer: Tracer, modes: List[str]
) -> Tuple[Any, List[TensorLogEntry]]:
    """The model's forward, traced: its output, and the saved activations written unseen.
    ``modes``: the torch modes the caller had active, which may hide calls from the wrappers."""
    inventory = tracer.inventory
    on_meta = any(t.is_meta for t in inventory.parameters + inventory.buffers) or any(
        t.is_meta for _, t in tensors_in_call(args, kwargs)
    )
    tracer.add_inputs(named_inputs(model, args, kwargs))
    try:
        output = tracer.run_model(model, args, kwargs)
    except Exception as error:
        if on_meta and is_value_error(error):  # control flow that reads values: name the line
            raise data_dependent_error(error, tracer.error_context) from error
        _annotate(error, tracer, model)
        raise
    tracer.add_outputs(output)
    tracer.notes.extend(lost_op_notes(modes, tracer.entries))
    if on_meta:
        tracer.notes.append(meta_note(model))
    tracer.mark_buffer_writes()
    stale: List[TensorLogEntry] = []
    if tracer.shared is not None:  # what the caller and model hold is only walked to copy from it
        handed_out = output if tracer.plan.hands_out_output else None
        stale = tracer.finish_sharing(_held_after(inventory, args, kwargs, handed_out))
    if inventory.has_lazy:
        inventory.describe_materialised()
    return output, stale


class PassSession:
    """What many passes on one model share while the model stays the same (``log_generate``'s
    steps): its inventory, made again when a module, parameter or buffer was replaced, and the
    torch functions its code bound to its own names (``bound.py``), found once and put in
    place again at each pass. About 1 ms of a pass on a small LLM. Torch and the model are
    patched only during each pass, as without a session. ``first``: an inventory the caller
    made just before the first pass (``log_forward_pass`` makes one to check the model), which
    that pass takes instead of walking the model again.

    Example:
        >>> model, plan = nn.Linear(2, 2), SavePlan()
        >>> session = PassSession()
        >>> [len(run_pass(model, (torch.ones(n, 2),), {}, plan, random_seed=0, session=session).records)
        ...  for n in (1, 2)]
        [3, 3]
    """

    def __init__(self, first: Optional[ModelInventory] = None) -> None:
        self._inventory: Optional[ModelInventory] = None
        self._model: Optional[nn.Module] = None
        self._fingerprint: Optional[List[Tuple[int, ...]]] = []
        self._bound: Optional[BoundReferences] = None
        # the caller's inventory of the model, made just before the first pass (``traceable_model``)
        # with nothing run since that could change it: that pass takes it as it is
        self._first = first

    def inventory_of(self, model: nn.Module) -> ModelInventory:
        first, self._first = self._first, None
        if first is not None and first.modules and first.modules[0] is model:
            # taken without a fingerprint (as long again as the walk it saves): a later pass
            # makes its own inventory
            self._inventory, self._model, self._fingerprint, self._bound = first, model, None, None
            return first
        if (
            self._inventory is None
            or self._model is not model
            or self._fingerprint is None
            or _fingerprint(self._inventory.modules) != self._fingerprint
        ):
            self._inventory, self._model = ModelInventory.of(model), model
            self._fingerprint = _fingerprint(self._inventory.modules)
            self._bound = None
        return self._inventory

    def bound_references(self, table: Any, model: nn.Module, inventory: ModelInventory) -> BoundReferences:
        """Found again when the wrappers or the inventory are new."""
        bound = self._bound
        if bound is None or bound.table is not table or bound.model is not model or inventory is not self._inventory:
            bound = self._bound = BoundReferences(table, model, inventory.modules)
        return bound


class HeldWrappers:
    """The wrappers kept in place from one pass to the next, in a ``with`` block (the steps of
    ``log_generate``), instead of put in place and back at each pass: each change of
    ``torch.Tensor``'s attributes empties the interpreter's caches of its methods, and running
    on after it cost a small LLM's decode step more than the pass itself.

    Between the passes the wrappers are inactive (no tracer: every call goes straight to
    torch's function), and other threads' passes run inside them. ``released()`` puts torch
    back as it is outside passes for a while (torchlens's own work that looks torch functions
    up by name, such as saving). Torch is restored exactly when the block ends.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> with HeldWrappers():
        ...     held = torch.relu is not torch._C._VariableFunctions.relu
        ...     n = len(run_pass(model, (torch.ones(1, 2),), {}, SavePlan(), random_seed=0).records)
        >>> held, n, torch.relu is torch._C._VariableFunctions.relu
        (True, 3, True)
    """

    def __init__(self) -> None:
        self.table: Any = None

    def __enter__(self) -> "HeldWrappers":
        _check_not_nested()
        with _PASS_LOCK:
            self.table = decorate.current_wrapper_table()
            ops.install(self.table)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _PASS_LOCK:
            ops.uninstall(self.table)

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        with _PASS_LOCK:
            holders = ops.set_aside(self.table)
        try:
            yield
        finally:
            with _PASS_LOCK:
                ops.put_back(self.table, holders)


def _fingerprint(modules: List[nn.Module]) -> List[Tuple[int, ...]]:
    """What the inventory is made of, by identity: each module's submodules, parameters, buffers."""
    return [
        (id(m), *map(id, m._modules.values()), *map(id, m._parameters.values()), *map(id, m._buffers.values()))
        for m in modules
    ]


def _held_after(inventory: ModelInventory, args: Args, kwargs: Kwargs, output: Any) -> List[torch.Tensor]:
    """What the caller and the model still hold after the pass: they may write into it later."""
    held = [t for _, t in tensors_in_call(args, kwargs)] + [t for _, t in tensors_in(output)]
    attributes: Dict[int, torch.Tensor] = {}
    for module in inventory.modules:
        tensors_held(module.__dict__, attributes)
    return held + list(attributes.values())


def _versions(tensors: List[torch.Tensor]) -> List[int]:
    out = []
    for t in tensors:
        try:
            out.append(t._version)
        except RuntimeError:  # an inference tensor: no version counter
            out.append(-1)
    return out


def _rerun_copying(
    model: nn.Module,
    inputs: Tuple[Args, Kwargs],
    plan: SavePlan,
    stale: List[TensorLogEntry],
    *,
    versions: Any,
    random_seed: Union[int, RngState],
    hooks: Sequence[PassHook],
    session: Optional["PassSession"],
) -> PassResult:
    """A saved activation was written by something the tracer does not see: run the pass again,
    copying every activation when it is made (``plan.copy_at_once``). Only possible if the first
    run left the model's buffers and the inputs as they were."""
    tensors, before = versions
    if _versions(tensors) != before:
        names = ", ".join(e.layer_type for e in stale[:5])
        raise RuntimeError(
            f"torchlens: the model wrote into saved activations ({names}) in a way torchlens cannot see (a call "
            "it does not trace), and it changed its buffers or inputs in place, so the pass cannot simply be run "
            "again. Pass activation_postfunc=lambda t: t, which copies every activation when it is made."
        )
    result = run_pass(model, *inputs, plan, random_seed=random_seed, hooks=hooks, session=session)
    result.notes.append(
        f"{len(stale)} saved activations were changed by a write torchlens does not see (a call it does not "
        "trace), so the pass was run a second time, copying every activation when it was made."
    )
    return result


def _annotate(error: BaseException, tracer: Tracer, model: nn.Module) -> None:
    """Add a note saying which operation was running; keep the model's own exception type."""
    if error is tracer.plan.postfunc_error or has_torchlens_note(error):
        return  # not the model's error: activation_postfunc's or a hook's (intervene=), which has its own note
    if isinstance(error, ActivationMemoryWarning):
        return  # torchlens's own warning, made an error by a warnings filter
    where = tracer.error_context or (
        f"after operation #{len(tracer.entries)}"
        + (f" inside module '{tracer.module_stack[-1][0]}'" if tracer.module_stack else "")
    )
    note = (
        f"torchlens: {type(model).__name__} raised {type(error).__name__} {where}. "
        "This is the model's own error: check that the inputs given to log_forward_pass are what "
        "the model's forward expects. torch has been restored to its normal state."
    )
    if hasattr(error, "add_note"):
        error.add_note(note)
    elif error.args and isinstance(error.args[0], str):  # Python < 3.11
        error.args = (f"{error.args[0]}\n{note}",) + error.args[1:]


__all__ = [
    "CudaGraphCaptureError",
    "check_not_capturing",
    "run_pass",
    "PassResult",
    "named_inputs",
    "PassSession",
    "HeldWrappers",
]
