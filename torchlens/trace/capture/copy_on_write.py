"""Saved activations kept without a copy until something could change them (copy on write).

Copying every saved activation costs more than the forward pass that made it (mostly fresh
memory, page by page). A saved activation only needs its own copy if its memory is written
after it was saved, and the writes a pass can make are visible to the tracer:

- an in-place operation or an ``out=`` argument of a logged call: ``before_write`` copies the
  saved activations that share the target's storage *before* the call runs;
- after the pass, the caller may write into what it holds (the model's inputs and outputs, the
  tensors its modules hold: caches, parameters, buffers): ``finish`` copies the saved
  activations that share their storage.

A write torchlens cannot see (a C extension writing into a tensor, an operation that updates an
argument without saying so) moves the tensor's version counter, which every saved activation
records: ``finish`` lists those as stale and the pass is run again, copying everything. Buffers
(updated in place by ``batch_norm``'s running statistics, which is no in-place operation by
name) and tensors sharing memory with parameters or buffers are always copied at once.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch

from ..records.tensor_log import TensorLogEntry

_Tensor = torch.Tensor
_STRIDED = torch.strided


def storage_key(tensor: torch.Tensor) -> Optional[int]:
    """The address of the tensor's memory, or None where it has none to share (sparse, nested,
    meta, empty, tensors of functorch transforms)."""
    try:
        if tensor.layout is not _STRIDED or tensor.is_nested or tensor.is_meta:
            return None
        # the storage's address, worked out from the tensor's own: asking for the storage
        # would make a Python object that lives as long as the tensor, for the collector to walk
        key: int = tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()  # type: ignore[assignment]
    except (RuntimeError, NotImplementedError, TypeError, ValueError, AttributeError):
        return None  # ValueError: a lazy module's parameter before it exists
    return key or None


class SharedActivations:
    """The saved activations of one pass that share memory with the model's tensors."""

    def __init__(self, model_tensors: Iterable[torch.Tensor]) -> None:
        # storage -> [(entry, version of its activation when saved)]
        self.by_storage: Dict[int, List[Tuple[TensorLogEntry, int]]] = {}
        # memory of parameters and buffers: never shared (updated outside the tracer's view)
        self.model_storages: Set[int] = {k for k in map(storage_key, model_tensors) if k is not None}
        self.stale: List[TensorLogEntry] = []

    def keep(self, tensor: torch.Tensor, entry: TensorLogEntry, detach: bool) -> Optional[torch.Tensor]:
        """``tensor`` itself (detached if asked) as the saved activation, or None: copy it."""
        if entry.kind == "buffer":
            return None
        key = storage_key(tensor)
        if key is None or key in self.model_storages:
            return None
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors have no version counter
            return None
        self.by_storage.setdefault(key, []).append((entry, version))
        return tensor.detach() if detach else tensor

    def before_write(self, tensor: object) -> None:
        """``tensor`` is about to be written: the activations sharing its memory get their copy."""
        if not isinstance(tensor, _Tensor):
            return
        key = storage_key(tensor)
        kept = self.by_storage.pop(key, None) if key is not None else None
        copies: Dict[Any, torch.Tensor] = {}  # one copy of each view held by several entries
        for entry, version in kept or ():
            saved = entry.activation
            if saved._version == version:
                view = _view_key(saved)
                copy = copies.get(view)
                if copy is None:
                    copy = copies[view] = saved.clone()
                entry.activation = copy
            else:  # already changed by a write the tracer did not see
                self.stale.append(entry)

    def finish(self, held: Iterable[torch.Tensor]) -> List[TensorLogEntry]:
        """End of the pass: copy what the caller or the model still holds (``held``); return the
        activations whose memory changed unseen (empty when the trace is right)."""
        for tensor in held:
            self.before_write(tensor)
        stale = self.stale
        for kept in self.by_storage.values():  # plain loops: one storage per activation, mostly
            for entry, version in kept:
                if entry.activation._version != version:
                    stale.append(entry)
        self.by_storage = {}
        return stale


def _view_key(t: torch.Tensor) -> Any:
    """What makes two saved tensors the same values: the object itself where it carries autograd
    history (its copy keeps that history), else where its view of the memory lies (an output
    saved both as its operation's and as the model's output: one copy of a large logits tensor,
    not two)."""
    if t.requires_grad:
        return id(t)
    return (t.data_ptr(), t.dtype, t.shape, t.stride())


__all__ = ["SharedActivations", "storage_key"]
