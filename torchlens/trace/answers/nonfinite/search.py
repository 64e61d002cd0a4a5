"""``find_nonfinite``: which operation first made NaN or Inf, forward or backward.

How it stays cheap: the first pass saves no activation, only a 0-d bool per tensor on its device
(``flags.FlagPlan``), and, when the forward stays finite, one more per gradient as backward
reaches each operation's output; all flags are read with one host transfer. Only when something
is found does a second pass run, saving just the producer and its parents (and their
gradients) for the report. The model's parameters, buffers and flags, the caller's random
generators, the inputs (each pass gets a copy) and the parameters' ``.grad`` (gradients are
taken with ``torch.autograd.grad``, which never writes ``.grad``) end as they were.
"""

from __future__ import annotations

import contextlib
import random
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ....arguments import check
from ...capture import RngState, add_note, eager_only, tensors_in, tensors_in_call, traceable_model
from ...history.model_history import ModelHistory
from ...input_copy import as_args, as_kwargs, require_model
from ...records.meta import is_meta_history, refuse_meta
from ...records.tensor_log import TensorLogEntry
from ...traced_pass import traced_pass
from ..source import source_of
from .flags import FlagPlan, FocusPlan, as_finite, as_nan_free, finite_flag, read_flags
from .report import NonfiniteReport, nonfinite_kind, parent_stats
from .snapshot import ModelSnapshot
from .walk import backward_producer, describe, downstream, forward_producer

LossFn = Callable[[Any], torch.Tensor]


def find_nonfinite(
    model: nn.Module,
    input_args: Any,
    input_kwargs: Optional[Dict[str, Any]] = None,
    backward: bool = True,
    loss_fn: Optional[LossFn] = None,
    random_seed: Union[int, RngState, None] = None,
) -> NonfiniteReport:
    """Find the operation that first produced NaN or Inf in one forward (and backward) pass.

    Parameters and buffers are checked first (``phase='parameter'``), then the inputs
    (``'input'``), then every operation's output in execution order (``'forward'``: the first
    one whose output is non-finite while all it read was finite). If the forward stays finite
    and ``backward=True``, backward runs on ``loss_fn(outputs)`` (default: the sum of every
    floating output) and the answer is the forward operation whose backward first turned a
    finite gradient into a non-finite one for its parents (``'backward'``), or the loss itself
    (``'loss'``). ``print(report)`` tells the story; see ``NonfiniteReport``.

    Args:
        model: any ``torch.nn.Module``.
        input_args, input_kwargs: as for ``log_forward_pass``.
        backward: also look for NaN/Inf made in backward when the forward is finite.
        loss_fn: ``loss_fn(outputs) -> scalar tensor``, ``outputs`` being what the model returned.
        random_seed: seeds the passes (random if None), or an ``RngState``: the generators' states
            every pass starts from (``tl.watch(on_nonfinite='trace')`` passes those at the start of
            the failing step). The caller's generators are restored.

    The model ends as it was found (parameters, buffers, ``training``, ``requires_grad``, the
    parameters' ``.grad``); the inputs are copied for each pass, so the caller's are untouched.
    If the model raises, its error is raised with a note naming the operation it was in.

    Example:
        >>> import torch, torchlens as tl
        >>> class Model(torch.nn.Module):
        ...     def forward(self, x):
        ...         return torch.log(x)
        >>> report = tl.find_nonfinite(Model(), torch.tensor([1.0, -1.0]))
        >>> report.label, report.kind, report.phase
        ('log_1_1', 'nan', 'forward')
        >>> tl.find_nonfinite(Model(), torch.tensor([1.0, 2.0])).found
        False
    """
    require_model(model, "find_nonfinite")
    check("find_nonfinite", loss_fn=loss_fn, backward=backward)  # e.g. loss_fn=lambda out: out.logits.mean()
    if not isinstance(random_seed, RngState):
        check("find_nonfinite", random_seed=random_seed)
    model, notes, _ = traceable_model(model)
    args, kwargs = as_args(input_args), as_kwargs(input_kwargs)
    if _on_meta(model, (args, kwargs)):  # no values: "every value stayed finite" would be a guess
        raise refuse_meta("find_nonfinite")
    seed: Union[int, RngState] = random.SystemRandom().randrange(2**32) if random_seed is None else random_seed
    if not isinstance(seed, RngState):
        seed = int(seed)
    with eager_only(), torch.enable_grad() if backward else contextlib.nullcontext():
        report = _find(_Search(model, args, kwargs, seed=seed, loss_fn=loss_fn), backward)
    for note in notes:
        print(f"torchlens: note: {note}", file=sys.stderr)
    report.notes.extend(notes)
    return report


class _Search:
    """One ``find_nonfinite`` call: the model, its inputs, the seed every pass uses."""

    def __init__(
        self, model: nn.Module, args: tuple, kwargs: dict, seed: Union[int, RngState], loss_fn: Optional[LossFn]
    ) -> None:
        self.model, self.args, self.kwargs, self.seed, self.loss_fn = model, args, kwargs, seed, loss_fn
        self.snapshot = ModelSnapshot(model)
        self.passes = 0

    # ----- passes ---------------------------------------------------------------------------
    def traced(self, plan: Any) -> Tuple[ModelHistory, Any, Tuple[tuple, dict]]:
        """A pass on a fresh copy of the inputs, with the buffers as they were and the snapshot
        watching writes into parameters; also the model's output object (what ``loss_fn``
        gets) and the inputs the pass used."""
        if self.passes:  # each pass starts from the buffers the first one found
            self.snapshot.restore_buffers()
        self.passes += 1
        traced = traced_pass(
            self.model, self.args, self.kwargs, plan, seed=self.seed, hooks=[self.snapshot], fresh_inputs=True
        )
        return traced.history, traced.output, traced.inputs

    def flag_pass(self, gradients: bool) -> "_FlagPass":
        plan = FlagPlan(gradients=gradients)
        try:
            history, output, inputs = self.traced(plan)
        except BaseException:
            plan.remove_hooks()
            raise
        codes = dict(zip(history.layer_labels, read_flags([e.activation for e in history.layer_list])))
        for e in history.layer_list:
            e.activation = None  # the flag only rode here; the history is metadata only
        return _FlagPass(history, codes, plan=plan, output=output, inputs=inputs)

    def backward(self, output: Any, inputs: Tuple[tuple, dict]) -> Tuple[Any, List[Tuple[str, Any]], Optional[str]]:
        """The loss, (leaf address, gradient) pairs, and why backward did not run (or None)."""
        loss = _loss(output, self.loss_fn)
        if loss is None or not loss.requires_grad:
            return loss, [], "the outputs (or the loss) do not require grad, so backward was not checked"
        leaves = _leaves(self.model, inputs)
        if not leaves:
            return loss, [], "nothing in the model or its inputs requires grad, so backward was not checked"
        try:
            # autograd.grad, not .backward(): the user's .grad fields are never written
            grads = torch.autograd.grad(loss, [t for _, t in leaves], allow_unused=True)
        except Exception as error:
            add_note(
                error,
                "torchlens: find_nonfinite: raised by the backward of the loss (the forward was finite); "
                "find_nonfinite(..., backward=False) checks the forward pass alone.",
            )
            raise
        return loss, list(zip([a for a, _ in leaves], grads)), None

    def focus_pass(self, history: ModelHistory, labels: List[str], gradients: bool) -> Optional[ModelHistory]:
        """A second pass keeping only ``labels`` (and, with ``gradients``, the gradients reaching
        them); None if the model ran differently this time."""
        by_label = {e.label: e for e in history.layer_list}
        plan = FocusPlan(frozenset(by_label[x].raw_index for x in labels if x in by_label), gradients)
        try:
            focused, output, inputs = self.traced(plan)
            if gradients:
                self.backward(output, inputs)
        finally:
            plan.remove_hooks()
        if focused.layer_labels != history.layer_labels:
            return None
        for e in focused.layer_list:
            if e.raw_index in plan.grads:
                e.gradient = plan.grads[e.raw_index]
        return focused


class _FlagPass:
    """The flag pass's history (metadata only), flags by label, and what backward needs."""

    def __init__(self, history: ModelHistory, codes: Dict[str, Optional[int]], plan: Any, output: Any, inputs: Any):
        self.history, self.plan, self.output, self.inputs = history, plan, output, inputs
        self.finite, self.nan_free = as_finite(codes), as_nan_free(codes)


def _find(search: _Search, backward: bool) -> NonfiniteReport:
    try:
        report = _answer(search, backward)
    finally:
        unseen = search.snapshot.restore()
    if unseen:
        report.notes.append(
            f"the model wrote into its parameters {', '.join(unseen)} without a torch call torchlens sees "
            "(through .data, or a C extension), so they could not be put back: they hold what the passes left."
        )
    return report


def _answer(search: _Search, backward: bool) -> NonfiniteReport:
    bad_state = _nonfinite_state(search.model)
    first = search.flag_pass(gradients=backward and bad_state is None)
    history, finite = first.history, first.finite
    if is_meta_history(history):  # made its tensors on meta itself: nothing was measured
        first.plan.remove_hooks()
        raise refuse_meta("find_nonfinite")
    if bad_state is not None:
        first.plan.remove_hooks()
        address, value = bad_state
        users = [e.label for e in history.layer_list if address in (e.param_addresses or ()) or e.address == address]
        bad_users = [x for x in users if finite.get(x) is False]
        return NonfiniteReport(
            found=True,
            phase="parameter",
            label=address,
            address=address,
            kind=nonfinite_kind(value),
            module=address.rpartition(".")[0] or None,
            propagated=sorted(set(bad_users + downstream(history, users, finite)), key=history.layer_labels.index),
            history=history,
            finite=finite,
        )
    answer = forward_producer(history, finite)
    if answer is not None:
        first.plan.remove_hooks()
        return _forward_report(search, first, *answer)
    if not backward:
        return NonfiniteReport(found=False, history=history, finite=finite)
    try:
        loss, leaf_grads, skipped = search.backward(first.output, first.inputs)
    finally:
        first.plan.remove_hooks()
    first.output = None  # frees the graph
    return _backward_report(search, first, loss, leaf_grads=leaf_grads, skipped=skipped)


def _on_meta(model: nn.Module, inputs: Tuple[tuple, dict]) -> bool:
    """Whether a parameter, a buffer or an input tensor is on the meta device (shapes, no values)."""
    state = [t for t in model.parameters() if not is_lazy(t)] + [t for t in model.buffers() if t is not None]
    return any(t.is_meta for t in state) or any(t.is_meta for _, t in tensors_in_call(*inputs))


def _nonfinite_state(model: nn.Module) -> Optional[Tuple[str, torch.Tensor]]:
    """The first parameter or buffer (address, value) holding NaN/Inf, read in one transfer."""
    named: List[Tuple[str, torch.Tensor]] = [(a, t) for a, t in model.named_parameters() if not is_lazy(t)]
    named += [(a, t) for a, t in model.named_buffers() if t is not None and not is_lazy(t)]
    flags = read_flags([finite_flag(t) for _, t in named])
    for (address, tensor), flag in zip(named, flags):
        if flag:
            return address, tensor
    return None


def _default_loss(output: Any) -> Optional[torch.Tensor]:
    """The sum of every floating output that requires grad (half precision summed in float32)."""
    parts = [t for _, t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not parts:
        return None
    sums = [t.float().sum() if t.dtype in (torch.float16, torch.bfloat16) else t.sum() for t in parts]
    total = sums[0]
    for s in sums[1:]:
        total = total + s
    return total


def _loss(output: Any, loss_fn: Optional[LossFn]) -> Optional[torch.Tensor]:
    if loss_fn is None:
        return _default_loss(output)
    try:
        loss = loss_fn(output)
    except Exception as error:  # the user's function: keep its error, say whose it is
        add_note(
            error,
            f"torchlens: find_nonfinite: loss_fn raised this; it gets what the model returned "
            f"({type(output).__name__}) and must return a scalar tensor.",
        )
        raise
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise TypeError(
            f"find_nonfinite: loss_fn(outputs) must return a tensor with one element (a scalar loss), got {got}."
        )
    return loss


def _leaves(model: nn.Module, inputs: Tuple[tuple, dict]) -> List[Tuple[str, torch.Tensor]]:
    """What backward differentiates for: parameters and leaf inputs that require grad."""
    found: List[Tuple[str, torch.Tensor]] = [
        (a, p) for a, p in model.named_parameters() if p.requires_grad and not is_lazy(p)
    ]
    found += [(f"input.{k}", t) for k, t in tensors_in_call(*inputs) if t.requires_grad and t.is_leaf]
    seen, out = set(), []
    for address, t in found:
        if id(t) not in seen:
            seen.add(id(t))
            out.append((address, t))
    return out


def _forward_report(search: _Search, first: _FlagPass, phase: str, e: TensorLogEntry) -> NonfiniteReport:
    nan = forward_producer(first.history, first.nan_free)
    nan_entry = nan[1] if nan is not None and nan[1] is not e else None
    labels = [e.label] + list(e.parent_layers)
    if nan_entry is not None:  # the first NaN, when the first non-finite value was an Inf
        labels += [nan_entry.label] + list(nan_entry.parent_layers)
    focused = search.focus_pass(first.history, labels, gradients=False)
    report = describe(first.history, focused, phase, e, finite=first.finite)
    if focused is None:
        report.notes.append(_RAN_DIFFERENTLY)
    if nan_entry is not None and report.kind != "nan":
        report.first_nan = describe(first.history, focused, "forward", nan_entry, finite=first.nan_free)
        report.first_nan.kind = "nan"
    return report


_RAN_DIFFERENTLY = (
    "the model ran differently in the second pass that keeps the producer's neighbourhood (its operations "
    "depend on something other than the inputs and the random seed), so the parents' values are not shown."
)


def _backward_report(
    search: _Search, first: _FlagPass, loss: Any, leaf_grads: List[Tuple[str, Any]], skipped: Optional[str]
) -> NonfiniteReport:
    history = first.history
    labels = {e.raw_index: e.label for e in history.layer_list}
    hooked = [(labels.get(i), flag) for i, flag in first.plan.grad_flags]
    flags = read_flags([finite_flag(loss)] + [f for _, f in hooked] + [finite_flag(g) for _, g in leaf_grads])
    order: List[str] = []
    grad_finite: Dict[str, Optional[bool]] = {}
    for (label, _), flag in zip(hooked, flags[1 : 1 + len(hooked)]):
        if label is None:
            continue  # pruned from the history: nothing the outputs depend on
        if label not in grad_finite:
            order.append(label)
        grad_finite[label] = False if grad_finite.get(label) is False else (None if flag is None else flag == 0)
    leaf_finite = {
        address: None if f is None else f == 0 for (address, _), f in zip(leaf_grads, flags[1 + len(hooked) :])
    }
    leaf_values = dict(leaf_grads)
    report = NonfiniteReport(
        found=False,
        history=history,
        finite=first.finite,
        gradient_finite={e.label: grad_finite.get(e.label) for e in history.layer_list},
        checked_backward=skipped is None,
    )
    if skipped is not None:
        report.notes.append(skipped)
        return report
    bad = [x for x in order if grad_finite[x] is False] + [a for a, f in leaf_finite.items() if f is False]
    if flags[0]:
        report.found, report.phase, report.kind = True, "loss", nonfinite_kind(loss)
        report.notes.append(f"loss_fn(outputs) is {report.kind} although every output of the model is finite.")
        return report
    if not bad:
        return report
    answer = backward_producer(history, order, grad_finite, leaf_finite)
    report.found = True
    if answer is None:  # the loss's backward gave an output a non-finite gradient
        focused = search.focus_pass(history, bad[:1], gradients=True)
        report.phase, report.propagated = "loss", bad[1:]
        report.kind = nonfinite_kind(focused[bad[0]].gradient) if focused is not None and bad[0] in focused else None
        report.notes.append(
            f"the gradient of the loss with respect to the model's output ({bad[0]}) is not finite: the loss's own "
            "backward made it (loss_fn, or the default sum of the outputs); the model's operations did not."
        )
        return report
    producer, bad_parents = answer
    report.phase, report.label = "backward", producer.label
    report.source, report.module = source_of(producer), producer.containing_module
    report.propagated = [x for x in bad if x not in bad_parents]
    parent_labels = list(producer.parent_layers)
    focused = search.focus_pass(history, [producer.label] + parent_labels, gradients=True)
    if focused is not None:
        report.history = focused
    source = focused if focused is not None else history
    for label in parent_labels:
        stats = parent_stats(label, source[label].activation)
        gradient = source[label].gradient
        stats.gradient_kind = nonfinite_kind(gradient) if gradient is not None else None
        report.parents.append(stats)
    for address in bad_parents:
        if address in leaf_values:  # a parameter or input: its gradient came from autograd.grad
            stats = parent_stats(address, _leaf_value(search.model, address, first.inputs))
            stats.gradient_kind = nonfinite_kind(leaf_values[address])
            report.parents.append(stats)
    kinds = [p.gradient_kind for p in report.parents if p.gradient_kind]
    report.kind = kinds[0] if kinds else None
    if focused is None:
        report.notes.append(_RAN_DIFFERENTLY)
    return report


def _leaf_value(model: nn.Module, address: str, inputs: Tuple[tuple, dict]) -> Optional[torch.Tensor]:
    if address.startswith("input."):
        return dict((f"input.{k}", t) for k, t in tensors_in_call(*inputs)).get(address)
    return dict(model.named_parameters()).get(address)


__all__ = ["find_nonfinite", "RngState"]
