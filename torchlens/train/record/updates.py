"""The ``updates`` kind: each watched parameter's change across ``optimizer.step()`` (value after
minus value before) and the update-to-weight ratio ``||dw|| / ||w||`` (``w`` before the step).

The optimizers are found by hooking their steps: the optimizers passed as ``tl.watch(...,
optimizer=)``, or else every optimizer (torch's global step hooks) whose step changes a watched
parameter. Only steps of logged training steps copy the parameters ("before" values); the hooks
read the parameters and never write them, so training is bitwise the same. A ratio far from
about 1e-3 is a classic warning sign (too small: the layer barely learns; too large: unstable).
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ..measure import LazySummary, measurable, summary_norm
from .recorder import StepRecorder


class UpdateHooks:
    """Optimizer step hooks that record the ``updates`` of a logged step into ``recorder``.

    ``logging()`` says whether a logged step is in progress (its number, else None);
    ``written(step, n)`` is called after an optimizer step recorded the updates of ``n`` parameters.
    """

    def __init__(
        self,
        recorder: StepRecorder,
        logging: Callable[[], Optional[int]],
        written: Callable[[int, int], None],
        optimizers: Optional[Iterable[torch.optim.Optimizer]] = None,
    ) -> None:
        self.recorder = recorder
        self.logging = logging
        self.written = written
        # id(optimizer) -> (step, its watched params, their copies, their norms) before its step
        # (the norms: a list, or one tensor of them all where the updates are measured together)
        self._before: Dict[int, Tuple[int, List[torch.Tensor], List[torch.Tensor], Any]] = {}
        self._handles: list = []
        # id(optimizer) -> CPU copies kept for its next logged step, their lazy summaries and
        # the parameters they were copies of (weakly: a watch keeps no parameter alive)
        self._spare: Dict[int, Tuple[List[torch.Tensor], List[LazySummary], List[weakref.ref]]] = {}
        # id(optimizer) -> its parameters copied again on the writer thread during a logged
        # step's backward pass (``prefetch``)
        self._prefetched: Dict[int, _Prefetch] = {}
        self._owners_of: Tuple[Optional[int], Dict[int, List[Tuple[str, str]]]] = (None, {})  # step, owners
        chosen = list(optimizers) if optimizers is not None else None
        if chosen is None:
            from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

            self._handles = [register_optimizer_step_pre_hook(self._pre), register_optimizer_step_post_hook(self._post)]
            return
        for opt in chosen:
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"tl.watch: optimizer= takes torch.optim.Optimizer objects, not {type(opt).__name__}.")
            self._handles += [opt.register_step_pre_hook(self._pre), opt.register_step_post_hook(self._post)]

    def _owners(self, step: int) -> Dict[int, List[Tuple[str, str]]]:
        """id(parameter) -> the (module address, name) pairs that hold it (once per step: the
        global hooks see every optimizer of the process)."""
        if self._owners_of[0] == step:
            return self._owners_of[1]
        owners: Dict[int, List[Tuple[str, str]]] = {}
        for module in self.recorder.model.modules():
            address = self.recorder.addresses.get(id(module))
            if address is None:
                continue
            for name, p in module._parameters.items():
                if p is not None:
                    owners.setdefault(id(p), []).append((address, name))
        self._owners_of = (step, owners)
        return owners

    def _pre(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        step = self.logging()
        if step is None:
            return  # a step that is not logged copies nothing
        owners = self._owners(step)
        params = [p for group in optimizer.param_groups for p in group["params"] if id(p) in owners]
        if params and self._batched(params):  # on a GPU: copied, and later measured, together
            with torch.no_grad():
                copies = [torch.empty_like(p) for p in params]
                torch._foreach_copy_(copies, [p.detach() for p in params])
                self._before[id(optimizer)] = (step, params, copies, torch.stack(_norms(copies)).double())
        elif params:
            with torch.no_grad():
                prefetched = self._prefetched.pop(id(optimizer), None)
                copies = prefetched.take(step, params) if prefetched is not None else None
                if copies is None:
                    if prefetched is not None:  # its copies are free: copied into again
                        self._spare[id(optimizer)] = (prefetched.copies, [], [])
                    copies = self._copies(optimizer, params)
                # ||w|| from this step's forward statistics, if unchanged since (measured by then,
                # or to be measured by the writer thread before the update needs it)
                known = self.recorder.norms_of(params)
                missing = [i for i, n in enumerate(known) if n is None]
                computed = dict(zip(missing, _norms([copies[i] for i in missing]))) if missing else {}
                norms = [n if n is not None else computed[i] for i, n in enumerate(known)]
                self._before[id(optimizer)] = (step, params, copies, norms)

    def _copies(self, optimizer: torch.optim.Optimizer, params: List[torch.Tensor]) -> List[torch.Tensor]:
        """Copies of ``params``: on the CPU into the copies of the last logged step once the writer
        thread has measured them (a fresh allocation there costs more than the copy: the memory
        is faulted in page by page); a GPU's caching allocator already reuses memory, and keeps
        none busy between steps."""
        kept, lazies, _ = self._spare.pop(id(optimizer), ([], [], []))
        free = bool(kept) and all(lazy.measured for lazy in lazies)
        if not free or len(kept) != len(params) or any(_unlike(k, p) for k, p in zip(kept, params)):
            return [p.detach().clone() for p in params]
        torch._foreach_copy_(kept, [p.detach() for p in params])
        return kept

    def _post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        saved = self._before.pop(id(optimizer), None)
        if saved is None or saved[0] != self.logging():
            return
        step, params, copies, norms = saved
        owners = self._owners(step)
        if isinstance(norms, torch.Tensor):  # the weights' norms of a batched step, as one tensor
            self._post_batched(step, params, copies, norms)
            return
        lazies: List[LazySummary] = []
        unready: List[LazySummary] = []  # those whose weight's norm the writer thread has still to measure
        with torch.no_grad():
            rest = list(zip(params, copies, norms))
            # before - after, computed in the copies (no new memory); the update is its negation,
            # the same floats (rounding is symmetric), so it is never materialised: its sample is
            # that of before - after negated, and its statistics are measured from the copies by
            # the writer thread (nothing changes them until then), then negated
            if rest:
                torch._foreach_sub_([before for _, before, _ in rest], [p.detach() for p, _, _ in rest])
            for p, reverse, norm in rest:
                lazy = LazySummary(reverse, then=functools.partial(_negated, weight_norm=norm))
                if reverse.is_cpu:  # sampled with the statistics, on the writer thread
                    # the positions drawn now, in this thread's order: whichever thread measures
                    # it takes the same sample (the same training gives the same run)
                    index = self.recorder.sampler.positions(reverse.numel(), reverse.device)
                    lazy.draw = functools.partial(self._negated_samples, index)
                    sample: Any = lazy
                else:
                    sample = self.recorder.sampler.values(reverse)
                    if sample is None:
                        continue
                    sample.neg_()
                    if sample.is_cuda:
                        self.recorder.sampled_on.add(sample.device)
                lazies.append(lazy)
                if isinstance(norm, LazySummary) and not norm.measured:
                    unready.append(lazy)
                self.recorder.add_update(owners.get(id(p), []), (sample, lazy, None))
        if all(c.device.type == "cpu" for c in copies):
            self._spare[id(optimizer)] = (copies, lazies, [weakref.ref(p) for p in params])
            self._measure_shared(lazies, unready)
        self.written(step, len(params) - len(rest) + len(lazies))

    def prefetch(self, step: int, run_soon: Callable[[Callable[[], None]], bool]) -> None:
        """A logged step's forward pass has ended: copy the parameters of each optimizer whose
        CPU copies of its last logged step are free again into those copies, on the writer
        thread (``run_soon``), while the backward pass runs, rather than on the training thread
        when the optimizer step begins. Nothing writes into the parameters between the two in a
        usual step; their version counters tell ``_pre`` if something did (then it copies again)."""
        for key, old in list(self._prefetched.items()):
            if old.step != step:  # taken for a step that had no optimizer step (it raised): free again
                old.settle()
                del self._prefetched[key]
                self._spare[key] = (old.copies, [], [weakref.ref(p) for p in old.params])
        for key, (kept, lazies, refs) in list(self._spare.items()):
            params = [ref() for ref in refs]
            if key in self._prefetched or not all(lazy.measured for lazy in lazies):
                continue
            if not params or any(p is None for p in params):  # a parameter gone since: nothing to copy
                continue
            if any(_unlike(k, p) for k, p in zip(kept, params)):  # converted since (model.half())
                continue
            job = _Prefetch(step, params, kept)  # type: ignore[arg-type]  # checked: none is None
            if not run_soon(job.run):
                return  # steps written on the training thread: there is no other thread to copy on
            del self._spare[key]  # the prefetch owns them now; ``take`` hands them back
            self._prefetched[key] = job

    def _measure_shared(self, lazies: List[LazySummary], unready: List[LazySummary]) -> None:
        """Measure the updates on both threads: training waits for them to be written when its
        optimizer step ends (a killed process keeps the step), so this thread measures half of
        their values itself while the writer thread measures the other half. Each half draws
        its samples with its own thread's generator, in that thread's order: the same training
        gives the same run. ``unready``: left to the writer thread, which measures the weights'
        norms they need first."""
        theirs: List[LazySummary] = []
        mine: List[LazySummary] = []
        load = [0, 0]  # values in each half
        left = {id(lazy) for lazy in unready}
        for lazy in sorted(lazies, key=lambda lazy: -lazy.values.numel()):  # type: ignore[union-attr]
            half = 0 if load[0] <= load[1] or id(lazy) in left else 1
            (theirs if half == 0 else mine).append(lazy)
            load[half] += lazy.values.numel()  # type: ignore[union-attr]
        hand = self.recorder.measure_soon
        if not mine or hand is None or not hand(theirs):
            return  # all measured when the step is written
        LazySummary.resolve(mine)

    def _batched(self, params: List[torch.Tensor]) -> bool:
        """Whether the updates of ``params`` are measured together (``measure/``): all of them
        on one device of the recorder's batched kind."""
        devices = {p.device for p in params}
        return (
            len(devices) == 1
            and next(iter(devices)).type in self.recorder.batch_devices
            and all(measurable(p) for p in params)
        )

    def _post_batched(
        self, step: int, params: List[torch.Tensor], copies: List[torch.Tensor], weight_norms: torch.Tensor
    ) -> None:
        """The updates (after - before, computed in the copies) measured together, with the
        update-to-weight ratio as their line: a fixed number of kernels for all parameters."""
        owners = self._owners(step)
        with torch.no_grad():
            torch._foreach_sub_(copies, [p.detach() for p in params])  # before - after
            torch._foreach_neg_(copies)  # the update itself: negation is exact

            def line(table: torch.Tensor) -> torch.Tensor:
                return _ratios(summary_norm(table), weight_norms.to(table.dtype))

            measured = self.recorder.batched.measure_now(copies, line)
        for p, m in zip(params, measured):
            self.recorder.add_update(owners.get(id(p), []), (m, m, None))
        self.written(step, len(params))

    def _negated_samples(
        self, index: Optional[torch.Tensor], reverses: Sequence[torch.Tensor]
    ) -> List[Optional[torch.Tensor]]:
        samples = [self.recorder.sampler.take(reverse, index) for reverse in reverses]
        return [None if sample is None else sample.neg_() for sample in samples]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._before, self._spare, self._prefetched = [], {}, {}, {}


class _Prefetch:
    """Copies of an optimizer's parameters taken on the writer thread (``UpdateHooks.prefetch``).
    ``take`` (on the training thread, when the optimizer step begins) gives them if every
    parameter is the one copied, unchanged since (``_mark``), else None: a copy that has not
    started by then is called off, one under way is waited for."""

    def __init__(self, step: int, params: List[torch.Tensor], copies: List[torch.Tensor]) -> None:
        self.step = step
        self.params = params
        self.copies = copies
        # what each parameter was when copied (read before the copy: a write during it shows)
        self.marks: Optional[List[Tuple[Any, ...]]] = None
        self._state = "queued"  # then "copying" and "copied" or "failed"; or "called off"
        self._lock = threading.Lock()
        self._over = threading.Event()

    def run(self) -> None:
        with self._lock:
            if self._state != "queued":
                return
            self._state = "copying"
        state = "failed"
        try:
            marks = [_mark(p) for p in self.params]
            with torch.no_grad():
                torch._foreach_copy_(self.copies, [p.detach() for p in self.params])
            self.marks, state = marks, "copied"
        except Exception:  # noqa: S110 - not the run's failure: the training thread copies again
            pass
        finally:
            with self._lock:
                self._state = state
            self._over.set()

    def settle(self) -> None:
        """Call the copy off if the writer thread has not started it, else wait for its end."""
        with self._lock:
            if self._state == "queued":
                self._state = "called off"
        if self._state != "called off":
            self._over.wait()

    def take(self, step: int, params: List[torch.Tensor]) -> Optional[List[torch.Tensor]]:
        self.settle()
        marks = self.marks
        if (
            marks is None
            or step != self.step
            or len(params) != len(self.params)
            or any(p is not q or _mark(p) != mark for p, q, mark in zip(params, self.params, marks))
        ):
            return None
        return self.copies


def _mark(param: torch.Tensor) -> Tuple[Any, ...]:
    """What tells a parameter's values changed: its version counter moves with every write, and
    its memory or layout with an assignment to ``.data`` (which leaves the counter as it was)."""
    return (param._version, param.data_ptr(), *_layout(param))


def _layout(t: torch.Tensor) -> Tuple[Any, ...]:
    return (t.shape, t.dtype, t.device, t.stride())


def _unlike(copy: torch.Tensor, param: torch.Tensor) -> bool:
    return _layout(copy) != _layout(param)


def _norms(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """The L2 norm of each tensor, in float32 at least (one fused call where torch has one)."""
    if all(t.dtype in (torch.float32, torch.float64) and t.layout == torch.strided for t in tensors):
        return list(torch._foreach_norm(tensors))
    return [torch.linalg.vector_norm(t.float()) for t in tensors]


def _ratios(change: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """``_ratio`` of each pair, on the device (no value read on the host)."""
    undefined = torch.where(change == 0, float("nan"), float("inf"))
    return torch.where(norm != 0, change / norm, undefined)


def _ratio(change: float, norm: float) -> float:
    """``||dw|| / ||w||`` (NaN for no change of a zero weight, inf for a change of one)."""
    return change / norm if norm != 0 else (float("nan") if change == 0 else float("inf"))


# EXACT_FIELDS of -x from those of x: mean negated, min and max swapped and negated, +inf and
# -inf counts swapped
_NEGATE_ORDER = [0, 1, 2, 4, 3, 5, 7, 6, 8, 9]
_NEGATE_SIGN = [1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0]


def _negated(reverse: torch.Tensor, weight_norm: Union[torch.Tensor, LazySummary]) -> torch.Tensor:
    """The ``exact_summary`` of an update from that of its negation, with the update-to-weight
    ratio ``||dw|| / ||w||`` as its line (``weight_norm``: or the weight's summary, to measure)."""
    if isinstance(weight_norm, LazySummary):
        LazySummary.resolve([weight_norm])
        row = weight_norm.summary
        weight_norm = summary_norm(row) if row is not None else torch.tensor(math.nan, dtype=reverse.dtype)
    if reverse.is_cpu:  # on the host: plain floats cost far less than tensor ops
        fields = reverse.tolist()
        fields = [sign * fields[i] for i, sign in zip(_NEGATE_ORDER, _NEGATE_SIGN)]
        fields[9] = _ratio(summary_norm(reverse).item(), weight_norm.item())
        return torch.tensor(fields, dtype=reverse.dtype)
    out = reverse[torch.tensor(_NEGATE_ORDER, device=reverse.device)]
    out *= torch.tensor(_NEGATE_SIGN, dtype=reverse.dtype, device=reverse.device)
    out[9] = summary_norm(reverse) / weight_norm.to(reverse.device, reverse.dtype)
    return out


__all__ = ["UpdateHooks"]
