"""``MemoryReport``: the answer of ``memory_report``, its totals printed and its table.

Example:
    >>> import torch, torchlens as tl
    >>> report = tl.memory_report(torch.nn.Linear(4, 4), torch.rand(2, 4), optimizer="sgd")
    >>> report.params, report.grads, report.optimizer_state
    (80, 80, 80)
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ...history.model_history import ModelHistory
from ...records.format import human_bytes


class MemoryReport:
    """The memory a training step holds and its FLOPs; made by ``tl.memory_report``.

    Bytes: ``params``, ``grads``, ``buffers``, ``optimizer_state``, ``saved_for_backward``
    (all autograd keeps between forward and backward, once per storage; ``saved_inputs`` is the
    part that is the model's own inputs, which the caller holds anyway), ``largest_transient``
    (the largest op output, ``largest_transient_op``), ``peak_estimate`` (their sum: an
    estimate, see ``memory_report``); ``cache`` (an inference plan, ``training=False``: the KV
    cache the model's output keeps; 0 otherwise). ``per_op`` and ``flops_per_op``: label -> bytes saved /
    forward FLOPs, in execution order; ``per_module`` and ``flops_per_module``: module call
    (``'address:pass'``) -> the same summed over the ops inside it, submodules included.
    ``forward_flops``, ``backward_flops`` (2x forward). ``history``: the traced pass (no
    values). ``print(report)`` shows the totals and what holds the most; ``to_pandas()`` a table.
    """

    def __init__(
        self,
        history: ModelHistory,
        params: int,
        grads: int,
        buffers: int,
        optimizer: Tuple[str, int],
        per_op: Dict[str, int],
        flops_per_op: Dict[str, int],
        saved_inputs: int,
        cache: int = 0,
        training: bool = True,
    ) -> None:
        self.history = history
        self.params, self.grads, self.buffers = params, grads, buffers
        self.optimizer, self.optimizer_state = optimizer  # its name, the bytes of its state
        self.per_op, self.flops_per_op = per_op, flops_per_op
        self.saved_inputs = saved_inputs
        self.saved_for_backward = sum(per_op.values())
        self.forward_flops = sum(flops_per_op.values())
        self.backward_flops = 2 * self.forward_flops
        self.per_module: Dict[str, int] = {}
        self.flops_per_module: Dict[str, int] = {}
        for e in history.layer_list:
            for module in e.containing_modules:
                self.per_module[module] = self.per_module.get(module, 0) + per_op.get(e.label, 0)
                self.flops_per_module[module] = self.flops_per_module.get(module, 0) + flops_per_op.get(e.label, 0)
        outputs = [(e.nbytes or 0, e.label) for e in history.layer_list if e.kind == "op"]
        self.largest_transient, self.largest_transient_op = max(outputs, default=(0, None))
        self.cache, self.training = cache, training
        self.peak_estimate = (
            params + grads + buffers + self.optimizer_state + self.saved_for_backward + cache + self.largest_transient
        )
        self.notes: List[str] = list(history.notes)
        if training and not grads and not self.saved_for_backward:
            self.notes.append(
                "Nothing requires grad (no trainable parameter, no input with requires_grad): a training step of this model saves nothing."
            )

    def __repr__(self) -> str:
        return (
            f"MemoryReport(peak_estimate={human_bytes(self.peak_estimate)}, "
            f"saved_for_backward={human_bytes(self.saved_for_backward)}, params={human_bytes(self.params)})"
        )

    def __str__(self) -> str:
        if not self.training:
            return self._inference_text()
        rows = [
            ("parameters", self.params),
            ("gradients", self.grads),
            (f"optimizer state ({self.optimizer})", self.optimizer_state),
            ("buffers", self.buffers),
            ("saved for backward", self.saved_for_backward),
            (f"largest transient ({self.largest_transient_op})", self.largest_transient),
            ("peak (estimate)", self.peak_estimate),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"Memory of a training step of {self.history.model_name} (one forward + backward):"]
        lines += [f"  {name:<{width}}  {human_bytes(value):>10}" for name, value in rows]
        lines.append(f"  {'forward FLOPs':<{width}}  {_flops(self.forward_flops):>10}")
        lines.append(f"  {'backward FLOPs (2x)':<{width}}  {_flops(self.backward_flops):>10}")
        lines.append(
            "  The peak is an estimate: allocator caching, kernels' temporaries and gradients of activations "
            "in flight are left out."
        )
        for title, table, flops in (
            ("Ops", self.per_op, self.flops_per_op),
            ("Module calls", self.per_module, self.flops_per_module),
        ):
            top = sorted((v, k) for k, v in table.items() if v)[::-1][:8]
            if top:
                lines.append(f"{title} holding the most for backward:")
                lines += [f"  {k:<32} {human_bytes(v):>10}  {_flops(flops.get(k, 0)):>10} FLOPs" for v, k in top]
        lines += [f"Note: {note}" for note in self.notes]
        return "\n".join(lines)

    def _inference_text(self) -> str:
        rows = [
            ("parameters", self.params),
            ("buffers", self.buffers),
            ("KV cache (past_key_values)", self.cache),
            (f"largest transient ({self.largest_transient_op})", self.largest_transient),
            ("peak (estimate)", self.peak_estimate),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"Memory of inference with {self.history.model_name} (one forward at these inputs' batch x sequence):"]
        lines += [f"  {name:<{width}}  {human_bytes(value):>10}" for name, value in rows]
        lines.append(f"  {'forward FLOPs':<{width}}  {_flops(self.forward_flops):>10}")
        lines.append(
            "  The peak is an estimate: allocator caching and kernels' temporaries are left out; the cache grows "
            "linearly with batch x sequence, so pass the longest sequence generate will reach."
        )
        lines += [f"Note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_pandas(self, level: str = "op") -> Any:
        """One row per op (``level='op'``) or per module call (``'module'``): saved bytes and
        forward/backward FLOPs (ops also: type, module, output bytes)."""
        import pandas as pd

        if level == "module":
            return pd.DataFrame(
                [
                    {
                        "module": m,
                        "saved_bytes": b,
                        "forward_flops": self.flops_per_module[m],
                        "backward_flops": 2 * self.flops_per_module[m],
                    }
                    for m, b in self.per_module.items()
                ]
            )
        if level != "op":
            raise ValueError(f"level must be 'op' or 'module', not {level!r}.")
        rows = []
        for e in self.history.layer_list:
            if e.label in self.per_op:
                flops = self.flops_per_op.get(e.label, 0)
                rows.append(
                    {
                        "label": e.label,
                        "layer_type": e.layer_type,
                        "module": e.containing_module,
                        "output_bytes": e.nbytes,
                        "saved_bytes": self.per_op[e.label],
                        "forward_flops": flops,
                        "backward_flops": 2 * flops,
                    }
                )
        return pd.DataFrame(rows)


def _flops(n: int) -> str:
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


__all__ = ["MemoryReport"]
