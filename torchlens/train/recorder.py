"""The hooks of a logged training step: they take samples of inputs, outputs, gradients and
parameters, on the tensors' device, and keep them until the step is written.

Module hooks live only during a logged forward pass; gradient hooks are tensor hooks (not full
backward hooks), so in-place operations such as ``ReLU(inplace=True)`` and ``out += identity``
are fine: a hook registered before an in-place change receives the gradient of the value it
saw. No hook returns anything, so backward computes exactly what it would without them, and
every hook is removed when its step ends (a leaf tensor such as a parameter passed to a child
module would otherwise keep one more hook per logged step). Parameter gradients are read when
a backward pass has ended (``collect_param_grads``), not while it runs: DistributedDataParallel
averages ``.grad`` at the very end of backward.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
from torch import nn

from ..errors import TorchlensError
from .calls import Call, call_id, input_tensors, module_info, output_tensors
from .sampling import Sampler

Key = Tuple[str, str, str]  # (call id, kind, name)


class ModelHook:
    """A module hook that does nothing in copies of the model (``copy.deepcopy``, pickling):
    only the model that was passed to ``watch`` is watched, and a copy stays copyable."""

    __slots__ = ("target",)

    def __init__(self, target: Optional[Callable]) -> None:
        self.target = target

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if self.target is not None:
            self.target(*args, **kwargs)

    def __deepcopy__(self, memo: dict) -> "ModelHook":
        return ModelHook(None)

    def __reduce__(self) -> tuple:
        return (ModelHook, (None,))


class InplaceGradientError(TorchlensError, RuntimeError):
    """A gradient hook could not be placed on a module's input or output."""


class StepRecorder:
    """Collects the samples of one logged step (one or several forward passes, then backward)."""

    def __init__(
        self, model: nn.Module, kinds: Set[str], sampler: Sampler, ignore_io_grad_classes: Tuple[type, ...]
    ) -> None:
        self.model = model
        self.addresses = {id(m): a for a, m in model.named_modules()}
        self.kinds = kinds
        self.sampler = sampler
        self.ignore_io_grad = ignore_io_grad_classes
        self.step: Optional[int] = None
        self.known_calls: Set[str] = set()
        self.new_calls: List[Call] = []
        self.pending: Dict[Key, List[torch.Tensor]] = {}
        self.param_grads: Dict[Tuple[str, str], torch.Tensor] = {}
        self.calls_of: Dict[str, List[str]] = {}  # module address -> call ids seen this step
        self.counts: Dict[str, int] = {}
        self.stack: List[str] = []
        self.touched: Dict[int, Tuple[torch.Tensor, List[Tuple[str, str]]]] = {}  # got .grad this backward
        self.nested_model_calls = 0  # the model calling itself (with include_model)
        self._module_hooks: list = []
        self._param_hooks: list = []
        self._tensor_hooks: list = []
        self.gate: Callable[[], bool] = lambda: True  # False while nothing may be recorded
        self.on_gradient: Callable[[], None] = lambda: None  # every gradient hook calls it

    # ----- the step's life ----------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Hooks on the parameters, also without ``params_grad``: a backward pass that reaches
        them is the one that ends the step (``torch.autograd.grad`` of a penalty does not)."""
        self.step = step
        self.pending, self.param_grads, self.calls_of, self.touched = {}, {}, {}, {}
        owners: Dict[int, List[Tuple[str, str]]] = {}
        params: Dict[int, nn.Parameter] = {}
        for address, module in self.model.named_modules():
            for name, p in module._parameters.items():
                if p is not None and p.requires_grad and not _is_lazy(p):
                    owners.setdefault(id(p), []).append((address, name))
                    params[id(p)] = p
        for pid, p in params.items():
            self._param_hooks.append(p.register_post_accumulate_grad_hook(self._grad_recorder(owners[pid], step)))

    def begin_forward(self, include_model: bool = False) -> None:
        """Hooks on every module for one forward pass (the model itself is called directly by
        the watch, unless ``include_model``)."""
        self.counts, self.stack, self.nested_model_calls = {}, [], 0
        for module in self.model.modules():
            if module is self.model and not include_model:
                continue
            self._module_hooks.append(module.register_forward_pre_hook(ModelHook(self.pre), with_kwargs=True))
            self._module_hooks.append(
                module.register_forward_hook(ModelHook(self.post), with_kwargs=True, always_call=True)
            )

    def end_forward(self) -> None:
        for h in self._module_hooks:
            h.remove()
        self._module_hooks = []

    def collect_param_grads(self) -> bool:
        """At the end of a backward pass: sample the ``.grad`` of each parameter it reached (a
        later backward of the same step replaces it). True if it reached any."""
        touched, self.touched = self.touched, {}
        if "params_grad" in self.kinds:
            for p, owners in touched.values():
                sample = self.sampler.values(p.grad) if p.grad is not None else None
                if sample is not None:
                    for owner in owners:
                        self.param_grads[owner] = sample
        return bool(touched)

    def end_step(self) -> Tuple[List[Key], List[torch.Tensor]]:
        """The step's samples, one per series (several forwards of one step are overlaid)."""
        if self.touched:  # a backward pass whose end was not seen (it raised)
            self.collect_param_grads()
        for h in self._param_hooks + self._tensor_hooks:
            h.remove()
        self._param_hooks, self._tensor_hooks = [], []
        for (address, name), sample in self.param_grads.items():
            for cid in self.calls_of.get(address, ()):
                self.pending.setdefault((cid, "params_grad", name), []).append(sample)
        keys, samples = [], []
        for key, parts in self.pending.items():
            keys.append(key)
            samples.append(parts[0] if len(parts) == 1 else torch.cat(parts))
        self.step = None
        self.pending, self.param_grads = {}, {}
        return keys, samples

    def take_new_calls(self) -> List[Call]:
        calls, self.new_calls = self.new_calls, []
        return calls

    # ----- hooks --------------------------------------------------------------------------
    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        address = self.addresses.get(id(module))
        if address is None or not self.gate():
            return
        if module is self.model and self.stack:  # part of the running pass, as in the traced graph
            self.nested_model_calls += 1
            return
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
        self._tensors(module, cid, input_tensors(args, kwargs))
        if "params" in self.kinds:
            for name, p in module._parameters.items():
                if p is not None and not _is_lazy(p):
                    self._add((cid, "params", name), self.sampler.values(p))

    def post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self.addresses.get(id(module)) is None or not self.stack or not self.gate():
            return
        if module is self.model and self.nested_model_calls:
            self.nested_model_calls -= 1
            return
        cid = self.stack.pop()
        if output is not None:
            self._tensors(module, cid, output_tensors(output))

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
        want_io = "io" in self.kinds
        want_grad = "io_grad" in self.kinds and not isinstance(module, self.ignore_io_grad)
        for name, t in named:
            if want_io:
                self._add((cid, "io", name), self.sampler.values(t))
            if want_grad and t.requires_grad:
                try:
                    handle = t.register_hook(self._norm_recorder((cid, "io_grad", name), self.step))
                except RuntimeError as error:
                    raise InplaceGradientError(
                        f"torchlens.train: cannot record the gradient of {name} of call '{cid}' "
                        f"({type(module).__name__}): {str(error).rstrip('.')}. Pass disable_inplace=True to tl.watch, or "
                        f"ignore_io_grad_classes=[{type(module).__name__}] to skip io gradients of that class."
                    ) from error
                self._tensor_hooks.append(handle)

    def _add(self, key: Key, sample: Optional[torch.Tensor]) -> None:
        if sample is not None:
            self.pending.setdefault(key, []).append(sample)

    def _norm_recorder(self, key: Key, step: Optional[int]) -> Callable:
        def record(grad: torch.Tensor) -> None:
            if self.step == step and grad is not None:
                self.on_gradient()
                self._add(key, self.sampler.sample_norms(grad))

        return record

    def _grad_recorder(self, owners: List[Tuple[str, str]], step: int) -> Callable:
        def record(param: torch.Tensor) -> None:
            if self.step == step:
                self.on_gradient()
                self.touched[id(param)] = (param, owners)  # .grad is read when backward has ended

        return record


def _is_lazy(p: torch.Tensor) -> bool:
    return isinstance(p, (nn.parameter.UninitializedParameter, nn.parameter.UninitializedBuffer))


__all__ = ["StepRecorder", "InplaceGradientError", "ModelHook"]
