"""``memory_report``: what one training step of a model holds in memory, and its FLOPs.

One traced forward pass with grad runs with ``torch.autograd.graph.saved_tensors_hooks``: each
tensor autograd saves for backward is noted with the op the tracer was running when it was
packed, once per storage (a view of a saved tensor, or a tensor two ops save, costs once, to
the first op). Parameters and buffers saved for backward are not counted there: they are
``params`` and ``buffers``. Meanwhile ``OpFlops`` counts each op's forward FLOPs with torch's
``flop_counter`` rules. Meta models (built under ``with torch.device("meta")``) work, and so
does ``device="meta"`` for a model with real weights: nothing is allocated.
"""

from __future__ import annotations

import bisect
import contextlib
import sys
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from ....arguments import ArgumentValueError, check
from ...capture import (
    MetaCopies,
    PassHook,
    PassRecords,
    SavePlan,
    check_device,
    eager_only,
    inputs_on,
    tensors_in,
    tensors_in_call,
    traceable_model,
)
from ...input_copy import as_args, as_kwargs, copy_inputs, require_model
from ...traced_pass import traced_pass
from .attention import FusedAttention
from .flops import OpFlops
from .optimizer_state import NAMES, optimizer_state
from .report import MemoryReport

OPTIMIZER_STATES = NAMES  # optimizer name -> float32 state tensors per parameter element


def memory_report(
    model: nn.Module,
    input_args: Any,
    input_kwargs: Optional[Dict[str, Any]] = None,
    optimizer: Any = None,
    device: Optional[str] = None,
    training: bool = True,
) -> MemoryReport:
    """What a training step of ``model`` on these inputs holds in memory, and its FLOPs.

    Measured in one traced forward pass with grad: the tensors autograd saves for backward
    (``saved_for_backward``, per op and per module call), and the forward FLOPs of each op by
    ``torch.utils.flop_counter``'s rules (backward: the usual 2x forward). Added to them:
    ``params``; ``grads`` (one per parameter that requires grad, same dtype); ``buffers``;
    ``optimizer_state``: ``None``/``'none'``: 0; ``'sgd'`` (with momentum): one float32 tensor
    per trainable parameter; ``'adam'``/``'adamw'``: two (``exp_avg``, ``exp_avg_sq``), i.e. 8
    bytes per trainable element, as in mixed-precision training. The optimizer object you
    hold (``torch.optim.Adam(model.parameters())``) counts what it keeps: its ``state`` once it
    has stepped, else what its class keeps for its options (``amsgrad``, ``momentum``,
    ``centered``), in the parameters' dtype as ``torch.optim`` does; a ``torch.optim`` class
    counts its default options (``torchlens.trace.answers.memory.optimizer_state``). ``peak_estimate`` is the sum of all
    these plus the largest single op output (``largest_transient``); it is an estimate because
    the allocator's caching and fragmentation, temporaries inside kernels, the gradients of
    activations alive during backward and the optimizer's own temporaries are not counted,
    while saved tensors freed as backward proceeds are counted as if all were alive at once.

    ``training=False`` plans inference instead (``generate``): one forward without grad at the
    inputs' batch x sequence; ``cache`` is what the model returns to be kept between steps (the
    tensors under a ``past_key_values`` or ``cache`` output: the KV cache at that length, once
    per storage), and ``peak_estimate`` is params + buffers + cache + the largest op output.
    Pass the longest sequence ``generate`` will reach (prompt plus new tokens), and
    ``use_cache=True`` where the model needs it; on ``device="meta"`` nothing is allocated.

    Args:
        model: any ``torch.nn.Module``; may live on the meta device (no memory needed).
        input_args, input_kwargs: as for ``log_forward_pass``.
        optimizer: ``None``, ``'sgd'``, ``'adam'``, ``'adamw'``, a ``torch.optim`` optimizer
            object, or its class.
        device: ``'meta'``: run on meta copies of the parameters and inputs (nothing is
            allocated; the model is left untouched).
        training: ``False``: an inference plan (see above); no optimizer then.

    The model ends as it was (parameters, buffers, ``training``, ``requires_grad``, ``.grad``:
    no backward runs).

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(100, 50), torch.nn.ReLU())
        >>> mem = tl.memory_report(model, torch.ones(8, 100), optimizer="adam")
        >>> mem.params, mem.grads, mem.optimizer_state
        (20200, 20200, 40400)
        >>> mem.per_op["linear_1_1"], mem.per_op["relu_1_2"]  # Linear saves its input, ReLU its output
        (3200, 1600)
        >>> mem.flops_per_op["linear_1_1"]  # 2 * 8 * 100 * 50
        80000
    """
    require_model(model, "memory_report")
    check("memory_report", training=training)
    if not training and optimizer is not None:
        raise ArgumentValueError(
            "memory_report: an inference plan (training=False) has no optimizer; leave optimizer=None."
        )
    trainable = [p for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad]
    state = optimizer_state(optimizer, trainable)  # before meta copies replace the parameters
    check_device(device)
    model, notes, _ = traceable_model(model)
    args, kwargs = as_args(input_args), as_kwargs(input_kwargs)
    if device is not None:
        args, kwargs = inputs_on("meta", args, kwargs)
    grad_mode = torch.enable_grad() if training else torch.no_grad()
    with eager_only(), grad_mode, MetaCopies(model) if device is not None else contextlib.nullcontext():
        report = _measure(model, (args, kwargs), state, training)
    for note in notes:
        print(f"torchlens: note: {note}", file=sys.stderr)
    report.notes.extend(notes)
    return report


class _SavedTensors(PassHook):
    """During the pass: which storages autograd saves, first by which op (raw index), and FLOPs."""

    def __init__(self, excluded: Dict[int, str], on_meta: bool) -> None:
        self.on_meta = on_meta
        self.excluded = excluded  # storage key -> 'param' / 'buffer': counted elsewhere
        self.saved: Dict[int, Tuple[int, int]] = {}  # storage key -> (raw index, bytes)
        self.held: List[Any] = []  # saved storages kept alive, so no key is reused in the pass
        self.flops: Dict[int, int] = {}  # raw index -> forward FLOPs
        self.contexts: List[Any] = []

    def pass_started(self, records: PassRecords) -> None:
        self.records = records
        contexts: List[Any] = [
            torch.autograd.graph.saved_tensors_hooks(self.pack, _unpack),
            OpFlops(self.flops, self.where, records),
        ]
        if self.on_meta:  # attention as a GPU's fused kernels keep it, not as meta's math path (attention.py)
            contexts.append(FusedAttention(records))
        for context in contexts:
            context.__enter__()
            self.contexts.append(context)

    def pass_ended(self) -> None:
        while self.contexts:
            self.contexts.pop().__exit__(None, None, None)

    def where(self) -> int:
        """The op in progress: its output will be the next record the tracer makes."""
        return self.records.count

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        records = self.records
        with records.paused():  # the calls below are ours, not the model's
            key, nbytes, storage = _storage_of(tensor)
            if key not in self.saved and key not in self.excluded:
                self.saved[key] = (records.count, nbytes)
                self.held.append(storage)
            # what autograd keeps: a detached alias. The tensor itself would make a cycle through
            # C++ when an op saves its own output (ReLU, tanh: the output's grad_fn holds the output),
            # which the garbage collector cannot see: the pass's saved tensors would outlive the report
            return tensor.detach()


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _storage_of(tensor: torch.Tensor) -> Tuple[int, int, Any]:
    """(key, bytes, object to keep alive) of the memory ``tensor`` lives in: its storage, also on
    meta (whose storages have no data pointer but distinct identities)."""
    try:
        storage = tensor.untyped_storage()
        return storage._cdata, storage.nbytes(), storage
    except Exception:  # a tensor without a storage (sparse, nested...): counted by its elements
        return id(tensor), tensor.numel() * tensor.element_size(), tensor


def _measure(model: nn.Module, inputs: Tuple[tuple, dict], optimizer: Tuple[str, int], training: bool) -> MemoryReport:
    params = {id(p): p for p in model.parameters()}.values()
    buffers = {id(b): b for b in model.buffers()}.values()
    excluded = {_storage_of(p)[0]: "param" for p in params}
    excluded.update({_storage_of(b)[0]: "buffer" for b in buffers})
    args, kwargs, _ = copy_inputs(model, *inputs)  # copied here: their storages are told apart from others
    tensors = [t for _, t in tensors_in_call(args, kwargs)]
    input_keys = {_storage_of(t)[0] for t in tensors}
    on_meta = any(t.is_meta for t in [*params, *buffers, *tensors])
    observer = _SavedTensors(excluded, on_meta)
    traced = traced_pass(model, args, kwargs, SavePlan(), seed=0, hooks=[observer], keep_buffers=True)
    history = traced.history
    cache = _cache_bytes(traced.output) if not training else 0
    del traced, args, kwargs  # nothing of the pass outlives it
    observer.held.clear()
    kept = [e.raw_index for e in history.layer_list]
    labels = [e.label for e in history.layer_list]

    def label_of(raw_index: int) -> str:
        """The first recorded op at or after ``raw_index`` (an op pruned from the history, e.g.
        one that only made a constant, passes its share on)."""
        position = bisect.bisect_left(kept, raw_index)
        return labels[min(position, len(labels) - 1)]

    per_op = {e.label: 0 for e in history.layer_list if e.kind == "op"}
    saved_inputs = 0
    for key, (raw_index, nbytes) in observer.saved.items():
        label = label_of(raw_index)
        per_op[label] = per_op.get(label, 0) + nbytes
        saved_inputs += nbytes if key in input_keys else 0
    flops_per_op = {label: 0 for label in per_op}
    for raw_index, flops in observer.flops.items():
        label = label_of(raw_index)
        flops_per_op[label] = flops_per_op.get(label, 0) + flops
    trainable = [p for p in params if p.requires_grad]
    report = MemoryReport(
        history=history,
        params=sum(_nbytes(p) for p in params),
        grads=sum(_nbytes(p) for p in trainable) if training else 0,  # inference keeps no gradient
        buffers=sum(_nbytes(b) for b in buffers),
        optimizer=optimizer,
        per_op=per_op,
        flops_per_op=flops_per_op,
        saved_inputs=saved_inputs,
        cache=cache,
        training=training,
    )
    if training and on_meta and any(e.layer_type == "scaleddotproductattention" for e in history.layer_list):
        report.notes.append(_SDPA_ON_META)
    return report


_SDPA_ON_META = (
    "On meta, scaled_dot_product_attention was counted as a fused kernel (flash or memory-efficient) keeps it for "
    "backward: q, k, v, the output and a logsumexp. Torch's math path, which meta would run, also keeps the "
    "batch x heads x seq x seq attention probabilities; to count those, build the model with "
    "attn_implementation='eager'."
)


def _cache_bytes(output: Any) -> int:
    """Bytes of the tensors under a ``past_key_values`` / ``cache`` part of a model's output
    (an HF ``DynamicCache``'s layers, a tuple of key/value pairs), once per storage."""
    storages: Dict[int, int] = {}
    for position, tensor in tensors_in(output):
        path = position if isinstance(position, tuple) else (position,)
        if any(isinstance(p, str) and ("cache" in p.lower() or "past_key" in p.lower()) for p in path):
            key, nbytes, _ = _storage_of(tensor)
            storages[key] = nbytes
    return sum(storages.values())


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


__all__ = ["memory_report", "OPTIMIZER_STATES"]
