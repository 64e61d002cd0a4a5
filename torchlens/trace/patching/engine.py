"""Running a patched pass: replay downstream of the patched layers from the saved graph, or,
where the graph cannot be replayed, run the model once with the patches as interventions.

``Replayer`` holds one traced pass (``save_function_args=True``, every activation saved). For
a set of patched layers it finds, once, every operation downstream of them (along child edges,
in execution order) and checks that each can be re-run; a patched pass then re-runs only those
operations (``replay.replay_entry``, what ``history.rerun`` and validation use) with the new
values of their parents and the saved values of the others. Operations not downstream keep
their saved values, so a patch at the last block re-runs a few operations, not the model; a
patch that changes no element (the source equals the run there, e.g. at a position before the
token that differs) re-runs nothing.

``OutputTemplate`` puts the model's output back together (a tensor, tuples, dicts, HF
``ModelOutput`` and cache objects) with the new output tensors, so the metric gets what
``model(*args)`` returns.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

import torch
from torch import nn

from ..api import log_forward_pass
from ..capture import BufferSnapshot, RngState, tensors_in
from ..history.model_history import ModelHistory
from ..input_copy import copy_inputs
from ..records.tensor_log import TensorLogEntry
from ..replay import replay_entry
from ..rerun import RerunError
from ..rerun import _check_replayable as check_replayable  # the rule rerun itself applies
from .select import PatchError

Patch = Callable[[torch.Tensor], torch.Tensor]  # saved (or recomputed) value -> patched value


class Replayer:
    """Patched passes of one traced history, re-running only what is downstream of a patch."""

    def __init__(self, history: ModelHistory) -> None:
        self.history = history
        self.by_label = {e.label: e for e in history.layer_list}
        self.order = {e.label: n for n, e in enumerate(history.layer_list)}
        self.outputs = [e for e in history.layer_list if e.kind == "output"]
        self._downstream: Dict[FrozenSet[str], Tuple[List[TensorLogEntry], Optional[str]]] = {}

    def downstream(self, labels: FrozenSet[str]) -> Tuple[List[TensorLogEntry], Optional[str]]:
        """The patched layers and every operation downstream of them, in execution order, and
        why they cannot be replayed (None when they can)."""
        found = self._downstream.get(labels)
        if found is not None:
            return found
        seen = set(labels)
        todo = list(labels)
        while todo:
            for child in self.by_label[todo.pop()].child_layers:
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        entries = sorted((self.by_label[x] for x in seen), key=lambda e: self.order[e.label])
        values = {x: torch.empty(0) for x in seen}  # stands for "a new value": parents in it need no saved one
        reason = None
        for e in entries:
            if e.label in labels and not any(p in seen for p in e.parent_layers):
                continue  # a patched layer upstream of the others is not re-run, only replaced
            try:
                check_replayable(e, self.history, values)
            except RerunError as error:
                reason = str(error).replace("rerun: ", "", 1)
                break
        found = self._downstream[labels] = (entries, reason)
        return found

    def run(self, patches: Dict[str, Patch]) -> Dict[str, torch.Tensor]:
        """The new value of every layer downstream of the patches (the patched ones included)."""
        entries, reason = self.downstream(frozenset(patches))
        if reason is not None:
            raise RerunError(reason)
        values: Dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for e in entries:
                if any(p in values for p in e.parent_layers):
                    value = replay_entry(e, self.by_label, values, guarded=not self.history.traced_here)
                    if not isinstance(value, torch.Tensor):
                        raise PatchError(
                            f"patch: re-running {e.label} ({e.func_name}) on the patched values failed: "
                            f"{value if isinstance(value, str) else type(value).__name__ + ' returned'}."
                        )
                elif e.label in patches:
                    value = e.activation
                else:
                    continue  # no parent changed (a patch upstream left its tensor as it was)
                if e.label in patches:
                    new = patches[e.label](value)
                    if value is e.activation and _same(new, value):
                        continue  # the source agrees here (a position before the change): nothing downstream moves
                    value = new
                values[e.label] = value
        return values

    def output_values(self, values: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        return [values.get(e.label, e.activation) for e in self.outputs]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b.detach()))


class ModelRunner:
    """Where the graph cannot be replayed: the model run once per patched pass, each patch an
    intervention at its layer (``log_forward_pass(intervene=...)``, which saves only the outputs)."""

    def __init__(self, model: nn.Module, args: tuple, kwargs: dict, history: ModelHistory) -> None:
        self.model, self.args, self.kwargs = model, args, kwargs
        self.seed = history.random_seed
        self.output_labels = history.output_layers

    def output_values(self, patches: Dict[str, Patch]) -> List[torch.Tensor]:
        intervene: Dict[Any, Any] = {label: _intervention(fn) for label, fn in patches.items()}
        with torch.no_grad():
            run = log_forward_pass(
                self.model,
                self.args,
                self.kwargs,
                layers_to_save=list(self.output_labels),
                intervene=intervene,
                random_seed=self.seed,
            )
        return [run[label].activation for label in self.output_labels]


def _intervention(fn: Patch) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    return lambda activation, entry: fn(activation)


class OutputTemplate:
    """The model's output with its tensors swappable: ``build(tensors)`` gives an output of the
    same kind (the same object types) holding ``tensors`` in the places the traced outputs had."""

    def __init__(self, model: nn.Module, args: tuple, kwargs: dict, history: ModelHistory) -> None:
        self.output = _plain_output(model, args, kwargs, history.random_seed)
        found = tensors_in(self.output)
        self.paths = [p if isinstance(p, tuple) else (p,) for p, _ in found]
        outputs = [e for e in history.layer_list if e.kind == "output"]
        if len(found) != len(outputs):
            raise PatchError(
                f"patch: the model's output holds {len(found)} tensors in a plain call but {len(outputs)} in the "
                "traced pass, so the output given to the metric cannot be rebuilt. Make the model's output depend "
                "on its inputs only."
            )

    def build(self, tensors: List[torch.Tensor]) -> Any:
        out = self.output
        for path, tensor in zip(self.paths, tensors):
            out = _put(out, path, tensor)
        return out


def _plain_output(model: nn.Module, args: tuple, kwargs: dict, seed: Optional[int]) -> Any:
    """One untraced call of the model, leaving its buffers and the random generators as they were."""
    args, kwargs, _ = copy_inputs(model, args, kwargs)
    buffers, rng = BufferSnapshot(model), RngState()
    try:
        if seed is not None:
            torch.default_generator.manual_seed(seed)  # the seed of the trace, as dropout would draw there
        with torch.no_grad():
            return model(*args, **kwargs)
    finally:
        buffers.restore()
        rng.restore()


def _put(value: Any, path: tuple, new: Any) -> Any:
    """A copy of ``value`` with ``new`` at ``path``; only the containers along the path are copied."""
    if not path:
        return new
    key, rest = path[0], path[1:]
    if type(value) is list:
        items = list(value)
        items[key] = _put(value[key], rest, new)
        return items
    if isinstance(value, tuple):
        items = list(value)
        items[key] = _put(value[key], rest, new)
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, Mapping):  # dict, HF ModelOutput (its copy keeps fields and keys in step)
        copied: Any = copy.copy(value)
        copied[key] = _put(value[key], rest, new)
        return copied
    copied = copy.copy(value)  # an object holding tensors in attributes (a key/value cache)
    setattr(copied, key, _put(getattr(value, key), rest, new))
    return copied


__all__ = ["Replayer", "ModelRunner", "OutputTemplate"]
