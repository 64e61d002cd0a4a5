"""The hooks of a logged training step: they take samples of inputs, outputs, gradients and
parameters, on the tensors' device, and keep them until the step is written.

Module hooks live only during a logged forward pass; gradient hooks are tensor hooks (not full
backward hooks), so in-place operations such as ``ReLU(inplace=True)`` and ``out += identity``
are fine: a hook registered before an in-place change receives the gradient of the value it
saw. No gradient hook returns anything, so backward computes exactly what it would without
them, and every hook is removed when its step ends. Parameter gradients are read when a
backward pass has ended (``collect_param_grads``), not while it runs: DistributedDataParallel
averages ``.grad`` at the very end of backward.

An input's gradient is what the call sends back into it, not the input's total gradient (a
tensor that also feeds a skip gets gradient from both): the forward pre-hook hands the call its
own alias of each input that requires grad (``aten.alias(x)``, one per distinct tensor, so
``query is key`` stays true), and the hook on the alias sees only this call's uses. When the
call changes its alias in place (``ReLU(inplace=True)``), autograd routes the later uses
through the in-place op's node on the alias's base: that node's gradient for the old base,
plus what reached the alias before the change, is the call's share, summed when the base's old
node is about to run. torch's own in-place activations (``IN_PLACE_ACTIVATIONS``) get no alias:
their share is read from the in-place op's node, which spares backward two copies of the
gradient. With ``input_grads`` (off by default: training never computes the data's gradient,
and the first layers' input-gradient work it adds is some 8% of a CPU ResNet-18 step), the
model's own floating inputs that do not require grad get an alias that does (a copy of a
detached leaf; the user's tensor is untouched). A series without values gets a reason
(``REASONS``): a gradient that never came, or values that cannot be measured (complex, empty,
sparse).
"""

from __future__ import annotations

import copy
import functools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import torch
from torch import nn

from ...errors import TorchlensError
from ...trace.observe import tensors_in_call
from ...web.stats import Summary
from ..measure import (
    SMALL,
    CopyPool,
    LazySummary,
    Measured,
    PhaseMeasure,
    local_shard,
    measurable,
    measure,
    summary_norm,
    tensor_key,
)
from ..model import Call, call_id, module_info, named_modules, output_tensors, position_name
from .sampling import NormsLater, Sampler
from .step_data import Key, Part, StepData

NOT_DIFFERENTIABLE = "no gradient: this call's output is not differentiable"
NO_OUTPUT = "no gradient: this call returns no tensor that backward could start from"
INPUT_GRADS_OFF = (
    "no gradient: input does not require grad and input gradients are off "
    "(tl.watch(..., input_grads=True) records them)"
)
NO_REQUIRES_GRAD = "no gradient: this input does not require grad"
NOT_FLOAT = "no gradient: not a floating-point tensor"
NOT_REACHED = "no gradient: no backward pass reached it in this step"
NOT_REBUILT = "no gradient: the input sits in a container torchlens cannot copy, so it gets no alias"
NOT_STRIDED = "no gradient: a sparse or other non-strided input gets no alias"
NOT_CHANGED = "no gradient: the in-place call left its input unchanged, so its share cannot be told apart"
COMPLEX_VALUES = "not measured: complex values have no order for a histogram; log x.abs() or x.real to see them"
NO_VALUES = "not measured: the tensor has no values (empty, or on the meta device)"
NOT_STRIDED_VALUES = "not measured: a sparse or other non-strided tensor"
REASONS = (
    NOT_DIFFERENTIABLE,
    NO_OUTPUT,
    INPUT_GRADS_OFF,
    NO_REQUIRES_GRAD,
    NOT_FLOAT,
    NOT_REACHED,
    NOT_REBUILT,
    NOT_STRIDED,
    NOT_CHANGED,
    COMPLEX_VALUES,
    NO_VALUES,
    NOT_STRIDED_VALUES,
)

# torch's activations that change their whole input in place whenever ``inplace`` is set (the
# exact classes: a subclass may do otherwise). Such a call's input gets no alias: its share of
# the gradient is what the in-place op's node sends back to the input's old value, read there.
# An alias changed in place would cost backward two more copies of the gradient (the view's
# as_strided node and the base's CopySlices), a few percent of a ResNet's step.
IN_PLACE_ACTIVATIONS = frozenset(
    {
        nn.ReLU,
        nn.ReLU6,
        nn.LeakyReLU,
        nn.ELU,
        nn.CELU,
        nn.SELU,
        nn.Hardtanh,
        nn.SiLU,
        nn.Mish,
        nn.Hardswish,
        nn.Hardsigmoid,
        nn.RReLU,
        nn.Threshold,
    }
)


_PLAIN_TENSORS = (torch.Tensor, nn.Parameter)  # types that are never a DTensor (``local_shard``)
# a view of the whole tensor whose backward passes the gradient on as it is (``view_as``'s
# reshapes it: one more operation per input in every logged backward)
_ALIAS = torch.ops.aten.alias.default


class _Alias:
    """One call's alias of one input tensor, and what is needed to follow in-place changes.
    The tensors are let go when the call returns: a logged step keeps no activation alive."""

    __slots__ = ("tensor", "keys", "base", "old_fn", "version", "geometry", "part", "split", "direct", "output_nr")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor: Optional[torch.Tensor] = tensor
        self.keys: List[Key] = []
        base = tensor._base  # None for the copy made for a model input
        self.base = base
        self.old_fn = base.grad_fn if base is not None else None
        self.version = tensor._version
        full = base is None or (
            base.shape == tensor.shape
            and base.stride() == tensor.stride()
            and base.storage_offset() == tensor.storage_offset()
        )
        # where the alias sits in its base: (size, stride, offset) of each, for _region
        self.geometry = None
        if not full:
            self.geometry = (
                (tuple(tensor.shape), tensor.stride(), tensor.storage_offset()),
                (tuple(base.shape), base.stride(), base.storage_offset()),
            )
        self.part: Optional[torch.Tensor] = None  # the gradient summed so far, when it comes in parts
        self.split = False  # the call changed the alias in place: its gradient comes in parts
        self.direct = False  # not an alias: the call's own input, changed in place (IN_PLACE_ACTIVATIONS)
        self.output_nr = 0  # with ``direct``: which output of its node ``old_fn`` the input was

    @classmethod
    def of_input(cls, tensor: torch.Tensor) -> "_Alias":
        """An in-place activation's own input (``direct``), read through its node's history."""
        entry = cls(tensor)
        entry.direct, entry.old_fn, entry.output_nr = True, tensor.grad_fn, tensor.output_nr
        return entry


class ModelHook:
    """A module hook that does nothing in copies of the model (``copy.deepcopy``, pickling):
    only the model that was passed to ``watch`` is watched, and a copy stays copyable."""

    __slots__ = ("target",)

    def __init__(self, target: Optional[Callable]) -> None:
        self.target = target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.target is not None:
            return self.target(*args, **kwargs)  # a pre-hook may hand the call new arguments
        return None

    def __deepcopy__(self, memo: dict) -> "ModelHook":
        return ModelHook(None)

    def __reduce__(self) -> tuple:
        return (ModelHook, (None,))


class InplaceGradientError(TorchlensError, RuntimeError):
    """A gradient hook could not be placed on a module's input or output."""


@dataclass(frozen=True)
class RecorderWiring:
    """How a recorder is wired into its watch: ``gate()`` False while nothing may be recorded
    (the graph's metadata pass, evaluation); ``on_gradient()`` called by every gradient hook;
    ``timed(hook)`` the hook with its time counted (the step timeline); ``copy_limit``: bytes the
    copies of large CPU tensors may hold (None: the default; 0: no copies); ``measure_soon``:
    starts measuring values on the writer thread while training goes on, True when it took
    them (None: they are measured when the step is written); ``wait_measured``: returns when
    the writer thread has measured all it took."""

    gate: Callable[[], bool] = lambda: True
    on_gradient: Callable[[], None] = lambda: None
    timed: Optional[Callable[[Callable[..., Any]], Callable[..., Any]]] = None
    copy_limit: Optional[int] = None
    measure_soon: Optional[Callable[[List[LazySummary]], bool]] = None
    wait_measured: Callable[[], None] = lambda: None


class StepRecorder:
    """Collects the samples of one logged step (one or several forward passes, then backward)."""

    def __init__(
        self,
        model: nn.Module,
        kinds: Set[str],
        sampler: Sampler,
        ignore_io_grad_classes: Tuple[type, ...],
        input_grads: bool = False,
        wiring: RecorderWiring = RecorderWiring(),
    ) -> None:
        self.model = model
        self.wants_input_grads = input_grads
        self.input_grads = input_grads  # off while the model's own call is one fullgraph graph
        self.addresses = {id(m): a for a, m in named_modules(model)}  # compile wrappers left out
        self.kinds = kinds
        self.sampler = sampler
        # large CPU tensors are copied here, then measured and sampled on the writer thread (see
        # CopyPool), with a generator of its own: the order of its draws is the step's order
        self.copies = CopyPool(wiring.copy_limit)
        self.later_sampler = Sampler(sampler.sample_n, seed=sampler.seed + 1)
        # tensors on these devices are measured together at the end of their phase (measure/)
        self.batched = PhaseMeasure(sampler.sample_n, sampler._generator)
        self.batch_devices = frozenset({"cuda"})
        # small CPU tensors are held to the end of their phase too, then copied together and
        # measured on the writer thread (large ones are copied into the pool when seen: faster)
        self.host_phase = PhaseMeasure(sampler.sample_n, sampler._generator, later=self.later_sampler.values_of)
        self.ignore_io_grad = ignore_io_grad_classes
        self.step: Optional[int] = None
        self.known_calls: Set[str] = set()
        self.new_calls: List[Call] = []
        self.pending: Dict[Key, List[Part]] = {}
        # CUDA devices of samples taken as tensors: the writer thread queues its kernels on their streams
        self.sampled_on: Set[torch.device] = set()
        self.param_grads: Dict[Tuple[str, str], Part] = {}
        self.updates: Dict[Tuple[str, str], Part] = {}  # (module address, name) -> its optimizer update
        self.version = 0  # grows with every value recorded: the step changed since it was written
        # id(tensor) -> (weak ref, its _version, its part): a tensor seen by several calls (a
        # block's output is its last layer's and the next block's input) is measured once
        self._seen: Dict[int, Tuple[Any, int, Part]] = {}
        # the gradient measured last, its version and its part: the gradient of a call's output
        # often arrives unchanged (a view of the same memory) at the input alias of the next call
        self._last_grad: Optional[Tuple[torch.Tensor, int, Part]] = None
        self._norms_later: List[NormsLater] = []  # small gradients' norms, computed with the pass's end
        # a series' summary, kept while its parts stay the same (a step is written more than once)
        self._summaries: Dict[Key, Tuple[int, Part, Summary]] = {}
        self.calls_of: Dict[str, List[str]] = {}  # module address -> call ids seen this step
        self.counts: Dict[str, int] = {}
        self.stack: List[str] = []
        self.frames: List[List[_Alias]] = []  # the aliases of each running call (parallel to stack)
        self.reasons: Dict[Key, str] = {}  # why a gradient series may get no values this step
        self.split: List[_Alias] = []  # aliases whose gradient comes in parts (changed in place)
        self.touched: Dict[int, Tuple[torch.Tensor, List[Tuple[str, str]]]] = {}  # got .grad this backward
        self.nested_model_calls = 0  # the model calling itself (with include_model)
        self.hidden: Set[int] = set()  # ids of modules never hooked (inside a fullgraph compile)
        self._module_hooks: list = []
        self._hooked: List[int] = []  # ids of the modules the module hooks are on, in order
        self.forward_active = False  # between begin_forward and end_forward: the module hooks record
        self._data: Dict[int, torch.Tensor] = {}  # the forward's data given no gradient, by id
        self._param_hooks: list = []
        # the parameters the hooks are on (id -> parameter) and their owners: kept from one
        # logged step to the next while they stay the same (as the module hooks are)
        self._hooked_params: Dict[int, nn.Parameter] = {}
        self._param_owners: Dict[int, List[Tuple[str, str]]] = {}
        self._tensor_hooks: list = []
        self.gate = wiring.gate  # False while nothing may be recorded
        self.on_gradient = wiring.on_gradient  # every gradient hook calls it
        self.measure_soon = wiring.measure_soon
        self.wait_measured = wiring.wait_measured
        # large CPU parameters and gradients read where they lie by the writer thread (no copy),
        # with their _version when seen: ``settle`` waits for the reading and checks them
        self._in_place: List[Tuple[LazySummary, torch.Tensor, int]] = []
        self.dropped = 0  # readings dropped so far: what was computed from them is stale
        self._unstable: Set[int] = set()  # ids of tensors once changed while read: copied since
        # activations read where they lie, settled when their forward pass ends; the places
        # (call, "io", name) whose activation the pass leaves unchanged, and those it changes
        self._in_place_forward: List[Tuple[LazySummary, torch.Tensor, int, Key]] = []
        self._steady: Set[Key] = set()
        self._unsteady: Set[Key] = set()
        self._learning: List[Tuple[Key, Any, int]] = []  # (place, weak ref, _version) copied this pass
        if wiring.timed is not None:
            self._time_hooks(wiring.timed)

    def _time_hooks(self, timed: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """The hooks' time summed per logged step (the timeline): each hook method wrapped."""
        for name in ("pre", "post", "_record_norm", "_record_alias", "_record_input", "_record_grad"):
            if hasattr(self, name):
                setattr(self, name, timed(getattr(self, name)))

    def hide(self, modules: Set[int], root_graph: bool) -> None:
        """Leave the modules of ``modules`` (ids) unhooked: they run inside a fullgraph compiled
        graph. ``root_graph``: the model's own call is such a graph, where an alias of the data
        that requires grad would make it compile a second time (Dynamo guards on
        ``requires_grad``): the data's gradient is left out then."""
        self.hidden = modules
        self.input_grads = self.wants_input_grads and not root_graph

    def record_parameters(self, module: nn.Module) -> None:
        """One call of ``module`` with its parameters alone (a module no hook may reach)."""
        self.pre(module, (), {})
        self.post(module, (), {}, None)

    # ----- the step's life ----------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Hooks on the parameters, also without ``params_grad``: a backward pass that reaches
        them is the one that ends the step (``torch.autograd.grad`` of a penalty does not).
        Those of the last logged step are kept while the parameters and their owners are the
        same; ``remove_param_hooks`` takes them off."""
        self.step = step
        self.pending, self.param_grads, self.calls_of, self.touched = {}, {}, {}, {}
        self.updates, self._seen, self._summaries, self._last_grad = {}, {}, {}, None
        self.reasons, self.split, self._norms_later = {}, [], []
        self.sampled_on = set()
        self.batched.clear()  # of a step that ended half-way
        self.host_phase.clear()
        owners: Dict[int, List[Tuple[str, str]]] = {}
        params: Dict[int, nn.Parameter] = {}
        for address, module in named_modules(self.model):
            for name, p in module._parameters.items():
                if p is not None and p.requires_grad and not _is_lazy(p):
                    owners.setdefault(id(p), []).append((address, name))
                    params[id(p)] = p
        same = owners == self._param_owners and all(self._hooked_params.get(i) is p for i, p in params.items())
        if not same:
            self.remove_param_hooks()
            for pid, p in params.items():
                self._param_hooks.append(
                    p.register_post_accumulate_grad_hook(functools.partial(self._record_grad, owners[pid]))
                )
            self._hooked_params, self._param_owners = params, owners

    def remove_param_hooks(self) -> None:
        """Take the parameters' hooks off (a step that is not logged, or the watch's end)."""
        for h in self._param_hooks:
            h.remove()
        self._param_hooks, self._hooked_params, self._param_owners = [], {}, {}

    def begin_forward(self, include_model: bool = False) -> None:
        """Hooks on every module for one forward pass (the model itself is called directly by
        the watch, unless ``include_model``). Those of the last logged forward are kept while the
        same modules are hooked: consecutive logged steps do not register them anew."""
        self.counts, self.stack, self.frames, self.nested_model_calls, self._data = {}, [], [], 0, {}
        hooked = [
            m for m in self.model.modules() if (m is not self.model or include_model) and id(m) not in self.hidden
        ]
        if self._hooked != [id(m) for m in hooked]:
            self.remove_forward_hooks()
            for module in hooked:
                self._module_hooks.append(module.register_forward_pre_hook(ModelHook(self.pre), with_kwargs=True))
                self._module_hooks.append(
                    module.register_forward_hook(ModelHook(self.post), with_kwargs=True, always_call=True)
                )
            self._hooked = [id(m) for m in hooked]
        self.forward_active = True

    def end_forward(self) -> None:
        """The forward pass has ended: the module hooks do nothing until the next ``begin_forward``
        (``remove_forward_hooks`` takes them off). The pass's tensors are measured now, together."""
        self.forward_active, self._data = False, {}
        self._settle_forward()
        self._flush_phases()

    def remove_forward_hooks(self) -> None:
        """Take the module hooks off (a step that is not logged, or the watch's end)."""
        self.forward_active = False
        for h in self._module_hooks:
            h.remove()
        self._module_hooks, self._hooked = [], []

    def collect_param_grads(self) -> bool:
        """At the end of a backward pass: sample the ``.grad`` of each parameter it reached (a
        later backward of the same step replaces it). True if it reached any."""
        touched, self.touched = self.touched, {}
        self.settle()  # the gradients read as they arrived, before the caller may change them
        self._flush_split()
        if "params_grad" in self.kinds:
            for p, owners in touched.values():
                part = self._values(p.grad) if p.grad is not None else None
                if part is not None:
                    self.version += 1
                    for owner in owners:
                        self.param_grads[owner] = part
            self._flush_phases()  # the gradients, measured together
        return bool(touched)

    def add_update(self, owners: List[Tuple[str, str]], part: Part) -> None:
        """A parameter's change across an optimizer step (the last one of the step counts)."""
        self.version += 1
        for owner in owners:
            self.updates[owner] = part

    def collect(self, kinds: Optional[Set[str]] = None) -> "StepData":
        """What the step has so far: the parts of each series (several forwards of one step are
        overlaid; ``StepData.summarize`` makes one sample and one exact summary of them, on the
        writer thread), and the reasons of the gradient series that got no values (of ``kinds``
        only, when given). The step goes on: a later backward or optimizer step adds to it."""
        wanted = (lambda kind: True) if kinds is None else kinds.__contains__
        self._flush_phases()  # anything seen since a phase ended (nothing, in the usual order)
        # the recorder's own lists, not copies (the step's series would be copied at every write):
        # they only grow, so the data keeps how many parts each had when collected
        if kinds is None:  # every series (the usual write): copied in C, not key by key
            pending = dict(self.pending)
        else:
            pending = {k: v for k, v in self.pending.items() if wanted(k[1])}
        counts = dict(zip(pending, map(len, pending.values())))
        for kind, parts_of in (("params_grad", self.param_grads), ("updates", self.updates)):
            if not wanted(kind):
                continue
            for (address, name), part in parts_of.items():
                for cid in self.calls_of.get(address, ()):
                    key = (cid, kind, name)
                    pending[key] = pending[key] + [part] if key in pending else [part]
                    counts[key] = len(pending[key])
        if kinds is None:
            reasons = {k: r for k, r in self.reasons.items() if k not in pending}
        else:
            reasons = {k: r for k, r in self.reasons.items() if k not in pending and wanted(k[1])}
        data = StepData(self._summaries)
        data.keys, data.parts, data.reasons = list(pending), list(pending.values()), reasons
        data.counts = list(counts.values())
        return data

    def end_step(self) -> "StepData":
        """The step's data (``collect``); its hooks are removed and the recorder is emptied."""
        if self.touched or self.split:  # a backward pass whose end was not seen (it raised)
            self.collect_param_grads()
        self.settle()
        for h in self._tensor_hooks:
            h.remove()
        self._tensor_hooks = []
        data = self.collect()
        self.step = None
        self.pending, self.param_grads, self.reasons, self.split = {}, {}, {}, []
        self.updates, self._seen, self._summaries, self._last_grad = {}, {}, {}, None
        return data

    def unmeasured(self) -> List[LazySummary]:
        """The step's values handed over so far that are still to be measured (copies that the
        writer thread measures)."""
        return [
            p[1]
            for parts in self.pending.values()
            for p in parts
            if isinstance(p[1], LazySummary) and p[1].values is not None
        ]

    def take_new_calls(self) -> List[Call]:
        calls, self.new_calls = self.new_calls, []
        return calls

    # ----- hooks --------------------------------------------------------------------------
    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> Optional[Tuple[tuple, dict]]:
        """Record the call's inputs; returns the arguments with the call's own aliases of its
        inputs (None: unchanged)."""
        address = self.addresses.get(id(module)) if self.forward_active else None
        if address is None or not self.gate():
            return None
        if module is self.model and self.stack:  # part of the running pass, as in the traced graph
            self.nested_model_calls += 1
            return None
        n = self.counts.get(address, 0) + 1
        self.counts[address] = n
        cid = call_id(address, n)
        if cid not in self.known_calls:
            self.known_calls.add(cid)
            self.new_calls.append(module_info(module, address, n, self.stack[-1] if self.stack else None))
        seen = self.calls_of.setdefault(address, [])
        if cid not in seen:
            seen.append(cid)
        self.stack.append(cid)
        frame: List[_Alias] = []
        self.frames.append(frame)
        found = [(f"input {position_name(p)}", p, t) for p, t in tensors_in_call(args, kwargs)]
        if "io" in self.kinds:
            for name, _, t in found:
                self._add((cid, "io", name), self._values(t, (cid, "io", name)))
        if "params" in self.kinds:
            for name, p in module._parameters.items():
                if p is not None and not _is_lazy(p):
                    self._add((cid, "params", name), self._values(p, (cid, "params", name), stable=True))
        if "io_grad" in self.kinds and not isinstance(module, self.ignore_io_grad):
            return self._alias_inputs(module, cid, (args, kwargs, found), frame)
        return None

    def _alias_inputs(self, module: nn.Module, cid: str, call: Tuple[tuple, dict, list], frame: List[_Alias]) -> Any:
        """Give the call its own alias of each input that can carry a gradient, hooked."""
        root = module is self.model and len(self.stack) == 1
        made: Dict[int, _Alias] = {}  # id(input) -> its alias: the same tensor gets the same alias
        in_place = len(call[2]) == 1 and type(module) in IN_PLACE_ACTIVATIONS and module.inplace is True
        swaps: List[Tuple[Any, torch.Tensor]] = []
        for name, position, t in call[2]:
            key = (cid, "io_grad", name)
            entry = made.get(id(t))
            if entry is None:
                if not (t.is_floating_point() or t.is_complex()):
                    self.reasons[key] = NOT_FLOAT
                    continue
                if t.requires_grad and t.layout != torch.strided:
                    self.reasons[key] = NOT_STRIDED
                    continue
                if in_place and t.requires_grad and t._base is None and t.grad_fn is not None:
                    entry = made[id(t)] = _Alias.of_input(t)  # no alias to swap in: followed in post
                    entry.keys.append(key)
                    continue
                if t.requires_grad:
                    try:
                        alias = _ALIAS(t)
                    except RuntimeError as error:  # a view whose base changed in place
                        raise _hook_error(module, cid, key[2], error) from error
                elif root and self.input_grads:  # the data: a copy that requires grad, not the user's tensor
                    alias = t.detach().requires_grad_().clone()  # a leaf could not be changed in place
                else:  # the data, also where the model hands it to a call, says how to get one
                    if root:
                        self._data[id(t)] = t
                    self.reasons[key] = INPUT_GRADS_OFF if id(t) in self._data else NO_REQUIRES_GRAD
                    continue
                entry = made[id(t)] = _Alias(alias)
            entry.keys.append(key)
            swaps.append((position, entry.tensor))
        if not swaps:
            for entry in made.values():  # an in-place activation's own input
                frame.append(entry)
                self.reasons[entry.keys[0]] = NOT_REACHED  # until a gradient comes
            return None
        try:
            replaced = _substitute(call[:2], swaps)
        except Exception:  # a container type that cannot be copied: no alias, and say so
            for entry in made.values():
                for key in entry.keys:
                    self.reasons[key] = NOT_REBUILT
            return None
        for entry in made.values():
            frame.append(entry)
            for key in entry.keys:
                self.reasons[key] = NOT_REACHED  # until a gradient comes
            self._tensor_hooks.append(
                entry.tensor.register_hook(functools.partial(self._record_alias, entry, self.step))
            )
        return replaced

    def post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if not self.forward_active or self.addresses.get(id(module)) is None or not self.stack or not self.gate():
            return
        if module is self.model and self.nested_model_calls:
            self.nested_model_calls -= 1
            return
        cid = self.stack.pop()
        frame = self.frames.pop() if self.frames else []
        outputs = output_tensors(output) if output is not None else []
        self._tensors(module, cid, outputs)
        if not frame:
            return
        differentiable = any(t.requires_grad for _, t in outputs)
        for entry in frame:
            if not differentiable:  # nothing for backward to come back through
                for key in entry.keys:
                    self.reasons[key] = NOT_DIFFERENTIABLE if outputs else NO_OUTPUT
            elif entry.direct:
                self._follow_input(entry)
            elif entry.base is not None and entry.tensor is not None and entry.tensor._version != entry.version:
                self._follow_inplace(entry)
            entry.tensor = entry.base = entry.old_fn = None

    def _follow_inplace(self, entry: _Alias) -> None:
        """The call changed its alias in place: the base's history now runs through the in-place
        op's node; its gradient for the base's old value is (most of) the call's share."""
        node, newer = entry.base.grad_fn if entry.base is not None else None, None
        while node is not None and node is not entry.old_fn:
            newer = node
            node = node.next_functions[0][0] if node.next_functions else None
        if node is None or newer is None:  # no in-place op that autograd saw (e.g. under no_grad)
            return
        entry.split = True
        self.split.append(entry)
        step = self.step

        def from_base(grad_inputs: tuple, grad_outputs: tuple) -> None:
            if self.step == step and grad_inputs and grad_inputs[0] is not None:
                self.on_gradient()
                self._add_part(entry, _region(grad_inputs[0], entry))

        def done(grad_outputs: tuple) -> None:  # every part has arrived when the old node runs
            if self.step == step:
                self._flush(entry)

        self._tensor_hooks.append(newer.register_hook(from_base))
        self._tensor_hooks.append(node.register_prehook(done))

    def _follow_input(self, entry: _Alias) -> None:
        """An in-place activation's input (no alias): its share is what the first node added by
        the call sends back to the input's old node, ``old_fn``."""
        node, newer = entry.tensor.grad_fn if entry.tensor is not None else None, None
        if entry.tensor is not None and entry.tensor._version != entry.version:
            while node is not None and node is not entry.old_fn:
                newer = node
                node = node.next_functions[0][0] if node.next_functions else None
        slots = [] if newer is None or node is None else _slots_of(newer, entry.old_fn, entry.output_nr)
        if not slots:  # not changed in place after all (its forward replaced): no share to read
            for key in entry.keys:
                self.reasons[key] = NOT_CHANGED
            return
        hook = functools.partial(self._record_input, entry, slots, self.step)
        self._tensor_hooks.append(newer.register_hook(hook))  # type: ignore[union-attr]

    def attach(self, module: nn.Module, name: str, tensor: torch.Tensor) -> None:
        address = self.addresses.get(id(module))
        cid = next((c for c in reversed(self.stack) if c.rpartition(":")[0] == address or c == address), None)
        if cid is None:
            if module is not self.model:
                raise RuntimeError(
                    f"torchlens.attach: module '{address}' is not running; call attach inside its forward."
                )
            cid = ""
        self._tensors(module, cid, [(name, tensor)])

    def _tensors(self, module: nn.Module, cid: str, named: List[Tuple[str, torch.Tensor]]) -> None:
        """Outputs (and attached tensors): their gradient is what arrives at them."""
        want_io = "io" in self.kinds
        want_grad = "io_grad" in self.kinds and not isinstance(module, self.ignore_io_grad)
        for name, t in named:
            if want_io:
                self._add((cid, "io", name), self._values(t, (cid, "io", name)))
            if want_grad and not t.requires_grad:
                self.reasons[(cid, "io_grad", name)] = NOT_DIFFERENTIABLE
            elif want_grad:
                self.reasons[(cid, "io_grad", name)] = NOT_REACHED
                try:
                    handle = t.register_hook(functools.partial(self._record_norm, (cid, "io_grad", name), self.step))
                except RuntimeError as error:
                    raise _hook_error(module, cid, name, error) from error
                self._tensor_hooks.append(handle)

    def _add(self, key: Key, part: Optional[Part]) -> None:
        if part is not None:
            self.version += 1
            self.pending.setdefault(key, []).append(part)

    def _values(self, t: torch.Tensor, place: Optional[Key] = None, stable: bool = False) -> Optional[Part]:
        """A sample of ``t`` and its statistics over all values, taken now (before any later
        in-place change), or at the end of the phase with the phase's other tensors on a GPU
        (``place``: where it was seen, see ``PhaseMeasure``); the same for a tensor already
        measured unchanged in this step. ``stable``: nothing may change ``t`` before the step's
        next ``settle`` (a parameter until backward ends or the optimizer steps, a gradient
        until its backward pass ends), so a large CPU one is read where it lies."""
        if type(t) not in _PLAIN_TENSORS:
            t = local_shard(t)  # a sharded (DTensor) parameter's own shard: distributed.py sums them
        seen = self._seen.get(id(t))
        batched = t.device.type in self.batch_devices
        if seen is not None and seen[0]() is t and seen[1] == t._version:
            if place is not None and isinstance(seen[2][1], Measured):
                (self.batched if batched else self.host_phase).seen_at(seen[2][1], place)
            return seen[2]
        key = tensor_key(t) if batched or (t.is_cpu and t.numel() <= SMALL) else None
        if key is not None:  # measured with its phase (its key: what its layout depends on)
            later = (self.batched if batched else self.host_phase).add(t, place, key)
            return self._remember(t, (later, later, None))
        if t.is_cpu and t.numel() > SMALL and (stable or place in self._steady):
            read = self._read_in_place(t, None if stable else place)
            if read is not None:
                return self._remember(t, read)
        if place is not None and not stable and place not in self._unsteady and self.measure_soon is not None:
            self._learning.append((place, weakref.ref(t), t._version))  # copied now; learnt at the pass's end
        # a large CPU tensor is copied into the pool (measured later), a small one the phase
        # cannot read (float8, say) copied now; a GPU tensor the phase cannot read measured now
        part: Part
        copied = measure(t, pool=self.copies) if t.numel() > SMALL or t.is_cpu else None
        if isinstance(copied, LazySummary):  # its sample is drawn from the copy, later
            copied.draw = self.later_sampler.values_of
            part = (copied, copied, None)
        else:
            sample = self.sampler.values(t)
            if sample is None:
                if place is not None:
                    self.reasons[place] = _unmeasured(t)
                return None
            if sample.is_cuda:
                self.sampled_on.add(sample.device)
            part = (sample, copied if copied is not None else measure(t, copy=sample), None)
        return self._remember(t, part)

    def _read_in_place(self, t: torch.Tensor, place: Optional[Key] = None) -> Optional[Part]:
        """``t`` measured and sampled where it lies by the writer thread, which takes it at once
        (a copy would cost a pass over its values on this thread); None where no writer thread
        takes it. ``place``: an activation's, settled when its forward pass ends (else when
        the backward pass does)."""
        if self.measure_soon is None or id(t) in self._unstable or not measurable(t):
            return None
        lazy = LazySummary(t.detach())
        lazy.draw = self.later_sampler.values_of
        if not self.measure_soon([lazy]):
            return None
        if place is None:
            self._in_place.append((lazy, t, t._version))
        else:
            self._in_place_forward.append((lazy, t, t._version, place))
        return (lazy, lazy, None)

    def _settle_forward(self) -> None:
        """When a forward pass ends: learn which places' activations nothing changed during
        the pass (read where they lie from the next step on: they are not copied) and which it
        changed in place (copied when seen, as before: ``ReLU(inplace=True)`` overwrites a
        batch norm's output, ``out += identity`` a block's); wait for the activations read where
        they lie, and drop the reading of one changed since it was seen (its place is copied
        from then on). Nothing reads them after this: the caller may change them."""
        learning, self._learning = self._learning, []
        for place, ref, version in learning:
            t = ref()
            if t is not None and t._version == version:
                self._steady.add(place)
            else:  # changed, or gone (not known unchanged): copied when seen
                self._unsteady.add(place)
        read, self._in_place_forward = self._in_place_forward, []
        if not read:
            return
        self.wait_measured()
        LazySummary.resolve([lazy for lazy, _, _, _ in read])  # any the writer did not take (it failed)
        changed = [(lazy, place) for lazy, t, version, place in read if t._version != version]
        for _, place in changed:
            self._steady.discard(place)
            self._unsteady.add(place)
        self._drop([lazy for lazy, _ in changed])

    def _drop(self, readings: List[LazySummary]) -> None:
        """Readings of tensors changed while they may have been read: no statistics and an
        empty sample this step; what was computed from them is stale."""
        for lazy in readings:
            lazy.summary = None
            lazy.sample = torch.empty(0)  # CPU float32, as the samples it stands for
        if readings:
            self.dropped += len(readings)
            self._summaries.clear()  # the series' summaries computed from them (the writer is idle)

    def settle(self) -> None:
        """Return when the values read where they lie are read: before anything may change
        them (the end of a backward pass, an optimizer step, the step's end). A tensor changed
        since it was seen (in place, inside the forward pass, say) may have been read half old
        and half new: its reading is dropped (no statistics and an empty sample this step), and
        it is copied when seen from then on."""
        if self._in_place_forward or self._learning:  # a forward pass whose end was not seen
            self._settle_forward()
        if not self._in_place:
            return
        read, self._in_place = self._in_place, []
        self.wait_measured()
        LazySummary.resolve([lazy for lazy, _, _ in read])  # any the writer did not take (it failed)
        self._unstable.update(id(t) for _, t, version in read if t._version != version)
        self._drop([lazy for lazy, t, version in read if t._version != version])

    def _flush_phases(self) -> None:
        self.batched.flush()
        self.host_phase.flush()
        if self._norms_later:
            pending, self._norms_later = self._norms_later, []
            NormsLater.resolve(pending, self.sampler)

    def _remember(self, t: torch.Tensor, part: Part) -> Part:
        """Keep ``t``'s part for the step: another call that sees it unchanged takes the same."""
        try:
            self._seen[id(t)] = (weakref.ref(t), t._version, part)
        except TypeError:  # a tensor subclass without weak references: measured each time
            pass
        return part

    def norms_of(self, tensors: List[torch.Tensor]) -> List[Optional[Union[torch.Tensor, LazySummary]]]:
        """The L2 norm of each tensor from its exact statistics taken in this step, if it has not
        changed since: a 0-d tensor, or the ``LazySummary`` the writer thread will measure (None
        for a tensor not measured in this step)."""
        out: List[Optional[Union[torch.Tensor, LazySummary]]] = []
        for t in tensors:
            seen = self._seen.get(id(t))
            row = seen[2][1] if seen is not None and seen[0]() is t and seen[1] == t._version else None
            if isinstance(row, LazySummary) and row.measured:
                row = row.summary
            out.append(summary_norm(row) if isinstance(row, torch.Tensor) else row)
        return out

    def _norms(self, grad: torch.Tensor) -> Optional[Part]:
        last = self._last_grad
        if last is not None and _same_values(last[0], last[1], grad):
            return last[2]
        if grad.layout != torch.strided or grad.numel() == 0:
            return None
        later = NormsLater(grad)
        if grad.is_cuda:  # its norms and their sample lie there
            self.sampled_on.add(grad.device)
        if grad.numel() <= SMALL:  # computed at the pass's end with the other small ones
            self._norms_later.append(later)
        else:  # now: holding it to the pass's end would hold its memory
            NormsLater.resolve([later], self.sampler)
        part: Part = (later, None, later)
        # held until the next one: its memory cannot go to another tensor meanwhile
        self._last_grad = (grad, grad._version, part)
        return part

    # the gradient hooks: partials of these methods (fewer objects than closures; a logged step
    # places hundreds, and what lives through the step adds to the process's garbage collections)
    def _record_norm(self, key: Key, step: Optional[int], grad: torch.Tensor) -> None:
        if self.step == step and grad is not None:
            self.on_gradient()
            self._add(key, self._norms(grad))

    def _record_alias(self, entry: _Alias, step: Optional[int], grad: torch.Tensor) -> None:
        if self.step != step or grad is None:
            return
        self.on_gradient()
        if entry.split:  # what reached the alias before the in-place change: one part
            self._add_part(entry, grad)
            return
        part = self._norms(grad)
        for key in entry.keys:
            self._add(key, part)

    def _record_input(
        self, entry: _Alias, slots: List[int], step: Optional[int], grad_inputs: tuple, grad_outputs: tuple
    ) -> None:
        grads = [grad_inputs[i] for i in slots if grad_inputs[i] is not None]
        if self.step != step or not grads:
            return
        self.on_gradient()
        part = self._norms(grads[0] if len(grads) == 1 else sum(grads[1:], grads[0]))
        for key in entry.keys:
            self._add(key, part)

    def _add_part(self, entry: _Alias, grad: torch.Tensor) -> None:
        g = grad.detach()
        entry.part = g if entry.part is None else entry.part + g

    def _flush(self, entry: _Alias) -> None:
        if entry.part is not None:
            part = self._norms(entry.part)
            entry.part = None
            for key in entry.keys:
                self._add(key, part)

    def _flush_split(self) -> None:
        for entry in self.split:
            self._flush(entry)

    def _record_grad(self, owners: List[Tuple[str, str]], param: torch.Tensor) -> None:
        if self.step is not None:  # a gradient arriving while a logged step runs is that step's
            self.on_gradient()
            self.touched[id(param)] = (param, owners)  # .grad is read when backward has ended
            if self.measure_soon is not None and "params_grad" in self.kinds:
                self._read_grad_now(param.grad)

    def _read_grad_now(self, grad: Optional[torch.Tensor]) -> None:
        """A large CPU gradient is read where it lies by the writer thread as it arrives, while
        the backward pass goes on, instead of all of them when it has ended (training would
        wait for them at the optimizer step). Read again at the pass's end, ``_values`` takes
        the same reading if the gradient has not changed since (a shared parameter gets more:
        then ``settle`` drops the first reading and the final gradient is copied)."""
        if grad is not None and grad.is_cpu and grad.numel() > SMALL:
            self._values(grad, stable=True)  # small ones are measured together at the pass's end


def _hook_error(module: nn.Module, cid: str, name: str, error: Exception) -> InplaceGradientError:
    cls = type(module).__name__
    return InplaceGradientError(
        f"torchlens.train: cannot record the gradient of {name} of call '{cid}' ({cls}): "
        f"{str(error).rstrip('.')}. Pass disable_inplace=True to tl.watch, or "
        f"ignore_io_grad_classes=[{cls}] to skip io gradients of that class."
    )


def _region(grad: torch.Tensor, entry: _Alias) -> torch.Tensor:
    """The part of a gradient of the alias's base that belongs to the alias."""
    if entry.geometry is None:
        return grad
    (size, stride, offset), (base_size, base_stride, base_offset) = entry.geometry
    if grad.stride() != base_stride:
        grad = torch.empty_strided(base_size, base_stride, dtype=grad.dtype, device=grad.device).copy_(grad)
    return grad.as_strided(size, stride, grad.storage_offset() + offset - base_offset)


def _substitute(call: Tuple[tuple, dict], swaps: List[Tuple[Any, torch.Tensor]]) -> Tuple[tuple, dict]:
    """``(args, kwargs)`` with the tensor at each position swapped; containers on the way are
    copied (the caller's lists and dicts stay as they were)."""
    args, kwargs = list(call[0]), dict(call[1])
    for position, tensor in swaps:
        path = position if isinstance(position, tuple) else (position,)
        top = args if isinstance(path[0], int) else kwargs
        top[path[0]] = _replaced(top[path[0]], path[1:], tensor)  # type: ignore[index]
    return tuple(args), kwargs


def _replaced(value: Any, path: tuple, tensor: torch.Tensor) -> Any:
    if not path:
        return tensor
    inner = _replaced(value[path[0]], path[1:], tensor)
    if isinstance(value, tuple):
        items = list(value)
        items[path[0]] = inner
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    new = copy.copy(value)  # list, dict and their subclasses
    new[path[0]] = inner
    return new


def _slots_of(node: Any, target: Any, output_nr: int) -> List[int]:
    """The positions of ``node``'s gradients (its inputs) that go to output ``output_nr`` of ``target``."""
    return [i for i, (fn, nr) in enumerate(node.next_functions) if fn is target and nr == output_nr]


def _same_values(seen: torch.Tensor, version: int, grad: torch.Tensor) -> bool:
    """Whether ``grad`` is the gradient ``seen`` (at ``version``) again, as a view of the same
    memory with the same layout: ``seen`` is held, so its memory can hold nothing else."""
    return (
        grad.data_ptr() == seen.data_ptr()
        and grad._version == version
        and grad.shape == seen.shape
        and grad.stride() == seen.stride()
        and grad.dtype == seen.dtype
        and grad.device == seen.device
    )


def _unmeasured(t: torch.Tensor) -> str:
    """Why the values of ``t`` get no histogram and no statistics."""
    if t.layout != torch.strided:
        return NOT_STRIDED_VALUES
    return COMPLEX_VALUES if t.is_complex() and t.numel() and not t.is_meta else NO_VALUES


def _is_lazy(p: torch.Tensor) -> bool:
    return isinstance(p, (nn.parameter.UninitializedParameter, nn.parameter.UninitializedBuffer))


__all__ = ["StepData", "StepRecorder", "RecorderWiring", "InplaceGradientError", "ModelHook", "REASONS"]
