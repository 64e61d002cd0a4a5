"""How saturated the bounded activations are, for ``run.health()``: on logged steps, each call of a
``Tanh``, ``Sigmoid``, ``Hardtanh`` or ``Hardsigmoid`` module counts, over ALL values of its output,
those within ``SATURATION_EPS`` of the module's bounds. The counts stay on the device until the
step ends and are read in one transfer; each logged step appends one line to
``saturation.jsonl`` in the run folder: ``{"step": s, "calls": {call id: [saturated, values]}}``.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..model import call_id, hookable_modules
from .recorder import ModelHook

SATURATION_EPS = 1e-3
FILE = "saturation.jsonl"


def bounds(module: nn.Module) -> Optional[Tuple[float, float]]:
    """The output range of a bounded activation module (None for any other module).

    Example:
        >>> bounds(nn.Tanh()), bounds(nn.Hardtanh(-2.0, 2.0)), bounds(nn.ReLU())
        ((-1.0, 1.0), (-2.0, 2.0), None)
    """
    if isinstance(module, nn.Hardtanh):  # ReLU6 is one: its bounds are 0 and 6
        return float(module.min_val), float(module.max_val)
    if isinstance(module, nn.Tanh):
        return -1.0, 1.0
    if isinstance(module, (nn.Sigmoid, nn.Hardsigmoid)):
        return 0.0, 1.0
    return None


class SaturationProbe:
    """Hooks on the model's bounded activations during logged forward passes."""

    def __init__(self, model: nn.Module, run_dir: Optional[str], gate: Callable[[], bool] = lambda: True) -> None:
        self.gate = gate  # False while nothing may be recorded (the watch's metadata pass)
        self.path = os.path.join(run_dir, FILE) if run_dir else None
        # compiled models: eager addresses, and no hook inside a fullgraph compile (compiled.py)
        self.targets = [(a, m, b) for a, m in hookable_modules(model) if (b := bounds(m)) is not None]
        self.names = {id(m): a for a, m, _ in self.targets}
        self.handles: list = []
        self.step: Optional[int] = None
        self.calls: Dict[str, int] = {}
        self.counts: List[Tuple[str, torch.Tensor, int]] = []  # (call id, saturated values, values)

    def begin_step(self, step: int) -> None:
        """A logged step begins: the previous one is written, the hooks go on."""
        self.end_step()
        if not self.targets or self.path is None:
            return
        self.step, self.calls = step, {}
        for _, module, limits in self.targets:
            # ModelHook: a copy of the model (the sentinel's rerun) carries no probe
            self.handles.append(module.register_forward_hook(ModelHook(self._hook(limits))))

    def begin_forward(self) -> None:
        """Calls are numbered per forward pass, as the recorder numbers them."""
        self.calls = {}

    def _hook(self, limits: Tuple[float, float]):
        lo, hi = limits

        def record(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if not isinstance(output, torch.Tensor) or not output.is_floating_point() or output.numel() == 0:
                return
            if not self.gate():
                return
            address = self.names.get(id(module))
            if address is None:
                return
            n = self.calls[address] = self.calls.get(address, 0) + 1
            x = output.detach()
            near = ((x <= lo + SATURATION_EPS) | (x >= hi - SATURATION_EPS)).sum()
            self.counts.append((call_id(address, n), near, x.numel()))

        return record

    def end_step(self) -> None:
        """Remove the hooks and append the step's counts (one host transfer)."""
        for h in self.handles:
            h.remove()
        self.handles = []
        if self.step is None or not self.counts or self.path is None:
            self.step, self.counts = None, []
            return
        values = torch.stack([c.to(self.counts[0][1].device) for _, c, _ in self.counts]).tolist()
        calls: Dict[str, List[int]] = {}
        for (cid, _, n), near in zip(self.counts, values):
            total = calls.setdefault(cid, [0, 0])  # several forwards in one step add up
            total[0] += int(near)
            total[1] += n
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": self.step, "calls": calls}) + "\n")
        self.step, self.counts = None, []


def read_saturation(run_dir: str) -> List[dict]:
    """The lines of ``saturation.jsonl`` (none for runs without bounded activations); a line
    being written is skipped."""
    path = os.path.join(run_dir, FILE)
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


__all__ = ["SaturationProbe", "bounds", "read_saturation", "SATURATION_EPS", "FILE"]
