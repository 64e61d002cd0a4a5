"""The ``updates`` kind: each watched parameter's change across ``optimizer.step()`` (value after
minus value before) and the update-to-weight ratio ``||dw|| / ||w||`` (``w`` before the step).

The optimizers are found by hooking their steps: the optimizers passed as ``tl.watch(...,
optimizer=)``, or else every optimizer (torch's global step hooks) whose step changes a watched
parameter. Only steps of logged training steps copy the parameters ("before" values); the hooks
read the parameters and never write them, so training is bitwise the same. A ratio far from
about 1e-3 is a classic warning sign (too small: the layer barely learns; too large: unstable).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from ..web.stats import exact_summary
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
        self._before: Dict[int, Tuple[int, List[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]] = {}
        self._handles: list = []
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
        if params:
            with torch.no_grad():
                copies = [p.detach().clone() for p in params]
                norms = [torch.linalg.vector_norm(c.float()) for c in copies]
                self._before[id(optimizer)] = (step, params, copies, norms)

    def _post(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        saved = self._before.pop(id(optimizer), None)
        if saved is None or saved[0] != self.logging():
            return
        step, params, changes, norms = saved
        owners = self._owners(step)
        with torch.no_grad():
            # after - before, computed in the copies (no new memory): -(before - after) is the
            # same float, as rounding is symmetric
            torch._foreach_sub_(changes, [p.detach() for p in params])
            torch._foreach_neg_(changes)
            ratios = [torch.linalg.vector_norm(d.float()) / w for d, w in zip(changes, norms)]
            added = 0
            for p, change, ratio in zip(params, changes, ratios):
                sample = self.recorder.sampler.values(change)
                if sample is not None:
                    self.recorder.add_update(owners.get(id(p), []), (sample, exact_summary(change, line=ratio), None))
                    added += 1
        self.written(step, added)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._before = [], {}


__all__ = ["UpdateHooks"]
