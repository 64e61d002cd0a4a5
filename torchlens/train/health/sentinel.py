"""The NaN sentinel of ``tl.watch(model, on_nonfinite=...)``: every training step, logged or not,
is checked for NaN/Inf in the model's outputs, the gradient that reaches them (the loss's) and the
parameters' gradients.

The check stays on the device: one 0-d flag per output (``isfinite(t).all()``), one per gradient
arriving at an output, and one fused ``_foreach_norm`` over the parameters' ``.grad`` when the
backward pass ends, accumulated in float64 (a finite float32 gradient of 1e20 has a float32 norm
of inf: it must not be called non-finite); the flags and the norms are read together with one
host transfer per step.

The norms also tell a run that diverges before anything is NaN (``DivergenceWarning``, once per
run, and an ``exploding`` finding in ``run.health()``): a parameter whose gradient norm grew
``GROWTH`` (1e6) times within ``WINDOW`` (2) steps, or whose norm is past what its dtype can
square (``torch.nn.utils.clip_grad_norm_`` then returns inf and zeroes the gradient). Only
when a step went non-finite (rare) does more run: the step's forward (and backward, when the
forward was finite) is re-run on a copy of the model, with the inputs the step used and the random
generators as they were when it began, to name the call that produced the value; with ``'trace'``
also the tracer (``tl.find_nonfinite``'s engine) names the operation and its line. All of this
happens before ``optimizer.step()``: the parameters are those the failing step saw.

Under ``torch.distributed`` the ranks decide together (``RankGroup.first_nonfinite``: one
``all_reduce`` per step); the rank whose own values went non-finite re-runs its step alone and
sends its event to the others: every rank raises, or rank 0 warns, at the same step.

What a step is checked for: values the model returns and the gradients that flow through it. A
NaN in a loss computed outside the model is seen through the gradient it sends into the model's
outputs (a loss that is NaN with a finite gradient is not seen).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ...errors import TorchlensError
from ..measure import RankGroup
from ..model import call_id, input_tensors, output_tensors
from ..record import SaturationProbe

MODES = ("warn", "raise", "trace")
EVENTS_FILE = "nonfinite.json"  # in the run folder: what the sentinel found, read by health and the page
_ENGINE = torch.autograd.Variable._execution_engine
# the gradient reaching an output is kept until the step ends (a rerun's backward starts from it);
# beyond this size (an LLM's logits) only with 'trace', to keep memory as it was otherwise
KEEP_GRAD_NUMEL = 1 << 24
GROWTH = 1e6  # a gradient norm this many times its value of WINDOW steps before: diverging
WINDOW = 2


class NonfiniteError(TorchlensError, FloatingPointError):
    """A watched training step went non-finite (``tl.watch(..., on_nonfinite='raise')``); raised
    from ``loss.backward()`` after the step is written, before the optimizer could use it."""


class NonfiniteWarning(UserWarning):
    """A watched training step went non-finite (``on_nonfinite='warn'`` or ``'trace'``); given once."""


class DivergenceWarning(UserWarning):
    """A parameter's gradient norm exploded while every value was still finite (any
    ``on_nonfinite`` mode); given once per run."""


def check_mode(mode: Optional[str]) -> Optional[str]:
    """The ``on_nonfinite`` value, checked.

    Example:
        >>> check_mode("warn"), check_mode(None)
        ('warn', None)
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"tl.watch: on_nonfinite must be None or one of {', '.join(map(repr, MODES))}, not {mode!r}.")
    return mode


def _floating(t: torch.Tensor) -> bool:
    return (t.is_floating_point() or t.is_complex()) and t.layout == torch.strided and not t.is_meta


@dataclass(frozen=True)
class SentinelLink:
    """What the sentinel needs of the watch whose steps it checks."""

    model: nn.Module
    run_dir: Optional[str]  # the run folder (None on ranks that write no run)
    ranks: Optional[RankGroup]  # the collectives under torch.distributed
    gate: Callable[[], bool]  # False while nothing may be recorded (the saturation probe's too)
    logging: Callable[[], bool]  # the step in progress is logged
    training: Callable[[], bool]  # the model trains (training mode, gradients on)
    flush: Callable[[], None]  # write the step in progress now


class Sentinel:
    """Checks each training step of a watch (``link``: what it needs of the watch). The watch
    calls ``forward_started``, ``step_started``, ``forward_ended``. With ``mode`` None it only
    counts saturated activations on logged steps (``record/saturation.py``)."""

    def __init__(self, link: SentinelLink, mode: Optional[str]) -> None:
        self.link, self.mode, self.model = link, mode, link.model
        self._rng_state: Any = None
        if mode is not None:
            from ...trace.answers import RngState  # loaded only when the sentinel is on

            self._rng_state = RngState
        self.probe: Optional[SaturationProbe] = None  # made at the first step, when the run folder exists
        self.step: Optional[int] = None
        self.inputs: Optional[Tuple[tuple, dict]] = None  # of the step's last forward
        self.rng: Any = None  # the generators when that forward began
        self.flags: List[torch.Tensor] = []  # 0-d bools on the device: outputs, then their gradients
        self.output_grads: Dict[int, torch.Tensor] = {}  # output index -> the gradient that reached it
        self.handles: list = []
        self.queued = False
        self.quiet = mode is None  # warn/trace: after the first finding, steps are no longer checked
        self.events: List[dict] = []
        self.diverging: List[dict] = []  # the run's divergence finding (one)
        # parameter name -> {step: its gradient norm} of the last steps (a step's later backward
        # passes, accumulating, replace its value: steps are counted, not backward passes)
        self.norms: Dict[str, Dict[int, float]] = {}

    # ----- the watch's calls ------------------------------------------------------------------
    def forward_started(self, args: tuple, kwargs: dict) -> None:
        if self.probe is not None:
            self.probe.begin_forward()
        if not self.quiet:
            self.inputs, self.rng = (args, kwargs), self._rng_state()

    def step_started(self, step: int) -> None:
        self._clear()
        self.step = step
        if self.probe is None:
            self.probe = SaturationProbe(self.model, self.link.run_dir, gate=self.link.gate)
        if self.link.logging():
            self.probe.begin_step(step)
        else:
            self.probe.end_step()

    def forward_ended(self, output: Any) -> None:
        if self.quiet or self.step is None or not self.link.training():  # evaluation is not checked
            return
        for i, (_, t) in enumerate(output_tensors(output)):
            if not _floating(t):
                continue
            self.flags.append(torch.isfinite(t.detach()).all())
            if t.requires_grad:
                try:
                    self.handles.append(t.register_hook(functools.partial(self._output_gradient, i, self.step)))
                except RuntimeError:  # a view autograd refuses hooks on: the parameters' gradients still tell
                    pass

    def close(self) -> None:
        self._clear()
        if self.probe is not None:
            self.probe.end_step()
        self.inputs = self.rng = None

    # ----- backward -------------------------------------------------------------------------------
    def _clear(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles, self.flags, self.output_grads = [], [], {}

    def _output_gradient(self, index: int, step: int, grad: torch.Tensor) -> None:
        if step != self.step or grad is None:
            return
        self.flags.append(torch.isfinite(grad).all())
        if self.mode == "trace" or grad.numel() <= KEEP_GRAD_NUMEL:  # for the rerun's backward
            self.output_grads[index] = grad.detach()
        if not self.queued:
            self.queued = True
            # a callback queued now runs after those queued by the pass (the watch's, DDP's)
            _ENGINE.queue_callback(lambda: _ENGINE.queue_callback(functools.partial(self._backward_ended, step)))

    def _backward_ended(self, step: int) -> None:
        self.queued = False
        if step != self.step or self.quiet:
            return
        named = [(n, p.grad) for n, p in self.model.named_parameters() if p.grad is not None and _floating(p.grad)]
        flags = list(self.flags)
        norms: Optional[torch.Tensor] = None
        if named:
            # one fused kernel per device and dtype, accumulated in float64: NaN/Inf make a norm
            # non-finite, a finite gradient never does (float32 squares overflow past ~1.8e19)
            parts = torch._foreach_norm([g.detach() for _, g in named], 2, dtype=torch.float64)
            norms = torch.stack([n.to(parts[0].device) for n in parts])
            flags.append(torch.isfinite(norms).all())
        ranks = self.link.ranks
        if ranks is not None and ranks.broken is None:
            # the ranks decide together (a NaN in one rank's outputs must stop them all): one
            # all_reduce of one number, whose read is the step's host read (distributed.py)
            own = self._all(flags[: len(self.flags)])
            source = ranks.first_nonfinite(own, flags[-1] if named else None)
            if source is not None:
                self._found(step, source)
            elif norms is not None:  # read after the collective's read: the device is idle by now
                self._growth(step, named, norms.tolist())
            return
        verdict = self._all(flags)
        if verdict is None:
            return
        if norms is None:
            finite, values = bool(verdict), []
        else:  # the one host transfer of the step: the verdict and the norms together
            read = torch.cat([verdict.to(norms.device, torch.float64).reshape(1), norms]).tolist()
            finite, values = read[0] != 0, read[1:]
        if not finite:
            self._found(step)
        elif values:
            self._growth(step, named, values)

    @staticmethod
    def _all(flags: List[torch.Tensor]) -> Optional[torch.Tensor]:
        if not flags:
            return None
        device = flags[-1].device
        fast = device.type != "cpu"  # a non-blocking copy to the host could be read before it lands
        return torch.stack([f.to(device, non_blocking=fast) for f in flags]).all()

    # ----- a diverging run ------------------------------------------------------------------------
    def _growth(self, step: int, named: List[Tuple[str, torch.Tensor]], values: List[float]) -> None:
        """Keep each parameter's gradient norm of the last ``WINDOW`` steps; the first parameter
        (largest first) whose norm exploded makes the run's divergence finding."""
        if self.diverging:
            return
        worst: Optional[Tuple[float, str, str]] = None  # (how bad, parameter, what happened)
        for (name, grad), norm in zip(named, values):
            before = self.norms.setdefault(name, {})
            limit = math.sqrt(torch.finfo(grad.dtype).max) if not grad.is_complex() else math.inf
            earlier = [(v, s) for s, v in before.items() if step - WINDOW <= s < step and v > 0]
            if earlier and norm >= GROWTH * min(earlier)[0]:
                low, at = min(earlier)
                grown = norm / low
                what = f"grew {grown:.1e}x in {step - at} step(s) (from {low:.3g} to {norm:.3g})"
                candidate = (grown, name, what)
            elif norm > limit:
                what = (
                    f"is {norm:.3g}, past what {str(grad.dtype).replace('torch.', '')} can square "
                    f"({limit:.3g}): a norm in that dtype is inf (torch.nn.utils.clip_grad_norm_ returns "
                    "inf and zeroes the gradient)"
                )
                candidate = (norm / limit, name, what)
            else:
                candidate = None
            if candidate is not None and (worst is None or candidate[0] > worst[0]):
                worst = candidate
            before[step] = norm
            for old in [s for s in before if s < step - WINDOW]:
                del before[old]
        if worst is None:
            return
        _, name, what = worst
        address = name.rpartition(".")[0]
        event = {
            "step": step,
            "parameter": name,
            "call": call_id(address, 1),
            "detail": f"the gradient norm of '{name}' {what}",
        }
        event["message"] = (
            f"torchlens: step {step}: the gradient norm of '{name}' {what}; every value is still finite, "
            "but training is diverging (lower the learning rate, clip gradients, or check the loss's scale)."
        )
        self.diverging.append(event)
        self._save()
        ranks = self.link.ranks
        if ranks is None or ranks.rank == 0:
            warnings.warn(DivergenceWarning(event["message"]), stacklevel=2)

    # ----- a non-finite step ----------------------------------------------------------------------
    def _found(self, step: int, source: Optional[int] = None) -> None:
        """Report a non-finite step; under a process group ``source`` is the rank that re-runs
        its step alone (on the unwrapped model's copy: no collective) and tells the others."""
        ranks = self.link.ranks if source is not None else None
        event: Any = None
        if ranks is None or ranks.rank == source:
            event = self._describe(step, source)
            if self.mode == "trace":
                self._trace(event)
        if ranks is not None:
            event = ranks.share(event, source)
        self.events.append(event)
        self._save()
        message = event["message"]
        if self.mode == "raise":
            self.link.flush()  # the step is written before the error leaves backward()
            raise NonfiniteError(
                f"{message} Training stopped before the optimizer used it (on_nonfinite='raise'); "
                "open the run's page or run.health() to see it, or use on_nonfinite='trace' to name the operation."
            )
        self.quiet = True
        self._clear()
        self.inputs = self.rng = None
        if ranks is None or ranks.rank == 0:  # one warning per run, not one per rank
            warnings.warn(NonfiniteWarning(message), stacklevel=2)

    def _describe(self, step: int, rank: Optional[int] = None) -> Dict[str, Any]:
        """Re-run the step on a copy of the model to name the call that produced the value."""
        event: Dict[str, Any] = {"step": step, "call": None, "phase": None}
        if rank is not None:
            event["rank"] = rank
        try:
            if rank is not None and self.link.ranks is not None and self.link.ranks.sharded:
                raise ValueError("its parameters are sharded over the ranks (a rerun on one rank alone would hang)")
            phase, cid, detail = locate(self.model, self.inputs, self.rng, self._surrogate())
            event.update(phase=phase, call=cid, detail=detail)
        except Exception as error:  # the rerun failed: the step is still reported
            event["detail"] = f"re-running the step to find the call failed ({type(error).__name__}: {error})"
        where = f" in '{event['call'] or type(self.model).__name__}'" if event["phase"] else ""
        on = f" on rank {rank}" if rank is not None else ""
        event["message"] = f"torchlens: step {step} went non-finite{on}{where}: {event['detail']}."
        return event

    def _surrogate(self) -> Any:
        """A loss whose gradient for the model's outputs is the one the real loss sent (a copy
        of the model gets the same backward without the user's loss function)."""
        grads = dict(self.output_grads)

        def loss(output: Any) -> torch.Tensor:
            total = None
            for i, (_, t) in enumerate(output_tensors(output)):
                g = grads.get(i)
                if g is not None and t.requires_grad:
                    part = (t * g).sum()
                    total = part if total is None else total + part
            if total is None:
                raise ValueError("no gradient reached the model's outputs in this step")
            return total

        return loss

    def _trace(self, event: Dict[str, Any]) -> None:
        """The op-level answer: find_nonfinite's engine on a copy, from the step's generator states."""
        from ...trace.answers import find_nonfinite

        if self.inputs is None or (self.link.ranks is not None and self.link.ranks.sharded):
            return
        try:
            twin = copy.deepcopy(self.model)
            report = find_nonfinite(
                twin,
                self.inputs[0],
                self.inputs[1],
                backward=True,
                loss_fn=self._surrogate() if self.output_grads else None,
                random_seed=self.rng,
            )
        except Exception as error:
            event["trace_error"] = f"{type(error).__name__}: {error}"
            return
        event["report"] = {
            "found": report.found,
            "phase": report.phase,
            "label": report.label,
            "kind": report.kind,
            "module": report.module,
            "story": str(report).split("\n")[0],
        }
        if report.source is not None:
            event["report"].update(
                file=report.source.file, line=report.source.line_number, code=report.source.code_line.strip()
            )
        if report.found and report.history is not None and self.link.run_dir:
            name = f"nonfinite_step{event['step']}.html"
            try:
                report.to_html(os.path.join(self.link.run_dir, name))
                event["page"] = name
            except Exception as error:  # the answer stays in the event without its page
                event["trace_error"] = f"drawing the report failed ({type(error).__name__}: {error})"
        if report.found and report.label:
            line = f" (line {event['report']['line']}: `{event['report']['code']}`)" if report.source else ""
            event["message"] = event["message"].rstrip(".") + f"; operation {report.label}{line}."
        elif not report.found:  # its story would contradict the sentinel: say that it could not reproduce it
            event["report"]["story"] = (
                "The tracer's re-run of this step stayed finite: it did not reproduce the step "
                "(another random draw, or a value the step's inputs no longer hold)."
            )
            event["message"] = event["message"].rstrip(".") + "; the tracer's re-run of the step stayed finite."

    def _save(self) -> None:
        if not self.link.run_dir:
            return
        path = os.path.join(self.link.run_dir, EVENTS_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"events": self.events, "diverging": self.diverging}, f)
        os.replace(tmp, path)  # a reader never sees half a file


def locate(model: nn.Module, inputs: Any, rng: Any, loss_fn: Any) -> Tuple[str, Optional[str], str]:
    """``(phase, call id, detail)``: re-run the forward on a copy of ``model`` with ``inputs`` from
    the generator states ``rng``; the producer is the first call to finish whose output is
    non-finite while its inputs were finite. If the forward is finite, backward runs from
    ``loss_fn(outputs)`` (see ``_backward_call``)."""
    if inputs is None:
        return "unknown", None, "the step's inputs were not kept"
    twin = copy.deepcopy(model)
    names = {id(m): a for a, m in twin.named_modules()}
    counts: Dict[str, int] = {}
    stack: List[Tuple[str, Optional[torch.Tensor]]] = []
    done: List[Tuple[str, Optional[torch.Tensor], Optional[torch.Tensor]]] = []  # (call, inputs ok, outputs ok)
    out_grads: Dict[str, List[torch.Tensor]] = {}  # call -> flags of the gradients reaching its outputs
    in_grads: Dict[str, List[torch.Tensor]] = {}  # call -> flags of what its backward sends to its inputs
    parents: set = set()

    def all_finite(tensors: List[torch.Tensor]) -> Optional[torch.Tensor]:
        flags = [torch.isfinite(t.detach()).all() for t in tensors if _floating(t)]
        return torch.stack([f.to(flags[0].device) for f in flags]).all() if flags else None

    def grad_flag(cid: str, store: Dict[str, List[torch.Tensor]]) -> Any:
        return lambda g: store.setdefault(cid, []).append(torch.isfinite(g).all())

    def alias(t: Any, cid: str) -> Any:
        """The call's own view of an input: its hook sees only what this call sends back."""
        if not isinstance(t, torch.Tensor) or not t.requires_grad or not _floating(t):
            return t
        a = t.view_as(t)
        a.register_hook(grad_flag(cid, in_grads))
        return a

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
        address = names[id(module)]
        counts[address] = counts.get(address, 0) + 1
        if stack:
            parents.add(stack[-1][0])
        cid = call_id(address, counts[address])
        stack.append((cid, all_finite([t for _, t in input_tensors(args, kwargs)])))
        return tuple(alias(a, cid) for a in args), {k: alias(v, cid) for k, v in kwargs.items()}

    def post(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        cid, inputs_ok = stack.pop()
        outputs = [t for _, t in output_tensors(output)]
        done.append((cid, inputs_ok, all_finite(outputs)))
        for t in outputs:
            if t.requires_grad and _floating(t):
                t.register_hook(grad_flag(cid, out_grads))

    hooks = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in twin.modules()]
    hooks += [m.register_forward_hook(post, with_kwargs=True) for m in twin.modules()]
    caller = rng.__class__()
    try:
        rng.restore()
        with torch.enable_grad():
            output = twin(*inputs[0], **inputs[1])
            codes = _read([(ok_in, ok_out) for _, ok_in, ok_out in done])
            for (cid, _, _), (ok_in, ok_out) in zip(done, codes):
                if ok_out is False and ok_in is not False:
                    return (
                        "forward",
                        cid,
                        f"the output of '{cid or type(model).__name__}' is the first non-finite value",
                    )
            if any(ok_out is False for _, ok_out in codes):  # only the model's own inputs were
                return "input", None, "the model's inputs hold NaN or Inf"
            for p in twin.parameters():
                p.grad = None
            loss_fn(output).backward()
    finally:
        caller.restore()
        for h in hooks:
            h.remove()
    return _backward_call(twin, done, (out_grads, in_grads), parents)


def _read(
    pairs: List[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]],
) -> List[Tuple[Optional[bool], Optional[bool]]]:
    """The flags of each pair, read in one transfer (None stays None)."""
    flat = [f for pair in pairs for f in pair if f is not None]
    values = iter(torch.stack([f.to(flat[0].device) for f in flat]).tolist() if flat else [])
    return [tuple(None if f is None else bool(next(values)) for f in pair) for pair in pairs]  # type: ignore[misc]


def _backward_call(twin: nn.Module, done: list, grads: Tuple[dict, dict], parents: set) -> tuple:
    """The backward's producer: in backward order, the first call (calls that contain others are
    left to their inner calls) whose outputs got finite gradients while what its backward sent to
    its inputs, or its own parameters' gradients, are not finite."""
    out_grads, in_grads = grads
    modules = dict(twin.named_modules())

    def finite(flags: List[torch.Tensor]) -> bool:
        return not flags or bool(torch.stack([f.to(flags[0].device) for f in flags]).all())

    for cid, _, _ in reversed(done):
        if cid in parents or not finite(out_grads.get(cid, [])):
            continue
        address = cid.rpartition(":")[0] if cid else ""
        own = [torch.isfinite(p.grad).all() for p in modules[address].parameters(recurse=False) if p.grad is not None]
        if not finite(in_grads.get(cid, []) + own):
            return "backward", cid, f"the backward of '{cid}' made a non-finite gradient from a finite one"
    return "backward", None, "a gradient is non-finite although the forward was finite"


__all__ = [
    "Sentinel",
    "SentinelLink",
    "NonfiniteError",
    "NonfiniteWarning",
    "DivergenceWarning",
    "check_mode",
    "locate",
    "MODES",
    "EVENTS_FILE",
]
