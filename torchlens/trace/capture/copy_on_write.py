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
records: ``finish`` lists those as stale and the pass is run again, copying everything.
Parameters, the buffers a pass may update unseen (of modules in training mode: ``batch_norm``
updates its running statistics in place, which is no in-place operation by name; of modules
whose forward torchlens does not know) and tensors sharing memory with them are copied at once.
On a GPU, the buffers of torch.nn's own modules in eval mode are kept like any activation and
copied with everything else the model holds at the end of the pass, together (``copies``: one
multi-tensor copy instead of a kernel launch per buffer, some forty on a ResNet-18); on the CPU,
where a copy costs the same now or later, they are copied when first read.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import torch

from ..records.tensor_log import TensorLogEntry

_Tensor = torch.Tensor
_STRIDED = torch.strided
# on the CPU a copy costs the same now or later (there is no kernel launch to save): its buffers
# are copied when first read, each on its own (tests set this False to run the GPU's way here)
CPU_COPIES_AT_ONCE = True
# torch's multi-tensor copy (torch >= 2.1 has it; a GPU runs it as one kernel for many tensors)
_FOREACH_COPY: Optional[Callable[[List[torch.Tensor], List[torch.Tensor]], None]] = getattr(
    torch, "_foreach_copy_", None
)


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


def copies(tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """A copy of each of ``tensors`` (as ``clone`` makes it: same values, dtype, device and
    layout), in one multi-tensor copy per device and dtype where there are several: on a GPU one
    kernel launch instead of one per tensor. Tensors with autograd history are cloned (their
    copies keep it), and so are tensor subclasses, quantized tensors and, while
    ``CPU_COPIES_AT_ONCE``, CPU tensors.

    Example:
        >>> a, b = torch.arange(3.0), torch.tensor([[True], [False]])
        >>> [(c.tolist(), c.data_ptr() != t.data_ptr()) for c, t in zip(copies([a, b, a * 2]), [a, b, a])]
        [([0.0, 1.0, 2.0], True), ([[True], [False]], True), ([0.0, 2.0, 4.0], True)]
    """
    made: List[Optional[torch.Tensor]] = [None] * len(tensors)
    groups: Dict[Tuple[torch.device, torch.dtype], List[int]] = {}
    for i, t in enumerate(tensors):
        if (
            _FOREACH_COPY is None
            or type(t) is not _Tensor
            or t.requires_grad
            or t.is_quantized
            or (CPU_COPIES_AT_ONCE and t.is_cpu)
        ):
            made[i] = t.clone()
        else:
            groups.setdefault((t.device, t.dtype), []).append(i)
    for group in groups.values():
        sources = [tensors[i] for i in group]
        if len(group) > 1:
            targets = [torch.empty_like(t) for t in sources]  # the layout clone() gives
            try:
                _FOREACH_COPY(targets, sources)  # type: ignore[misc]  # not None: tested above
            except (RuntimeError, NotImplementedError, TypeError):  # a kind torch's copy refuses
                targets = [t.clone() for t in sources]
        else:
            targets = [sources[0].clone()]
        for i, copy in zip(group, targets):
            made[i] = copy
    return made  # type: ignore[return-value]  # every place filled above


class SharedActivations:
    """The saved activations of one pass that share memory with the model's tensors."""

    def __init__(
        self,
        parameters: List[torch.Tensor],
        buffers: List[torch.Tensor],
        kept_buffers: Sequence[torch.Tensor] = (),
    ) -> None:
        # storage -> [(entry, version of its activation when saved)]
        self.by_storage: Dict[int, List[Tuple[TensorLogEntry, int]]] = {}
        # the buffers whose records stay uncopied until the pass ends (held by the model, so
        # their ids are theirs while the pass runs); every other buffer's record is copied at once
        self.kept_buffers = list(kept_buffers)
        self._kept_ids = set(map(id, self.kept_buffers))
        # memory of parameters and of the other buffers: never shared (updated unseen, maybe)
        fixed = itertools.chain(parameters, (b for b in buffers if id(b) not in self._kept_ids))
        self.model_storages: Set[int] = {k for k in map(storage_key, fixed) if k is not None}
        self.stale: List[TensorLogEntry] = []

    def keep(self, tensor: torch.Tensor, entry: TensorLogEntry, detach: bool) -> Optional[torch.Tensor]:
        """``tensor`` itself (detached if asked) as the saved activation, or None: copy it."""
        if entry.kind == "buffer" and id(tensor) not in self._kept_ids:
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
        if kept:
            self._copy(kept)

    def finish(self, held: Iterable[torch.Tensor]) -> List[TensorLogEntry]:
        """End of the pass: copy what the caller or the model still holds (``held``, and the
        buffers kept), all together; return the activations whose memory changed unseen (empty
        when the trace is right)."""
        to_copy: List[Tuple[TensorLogEntry, int]] = []
        for tensor in itertools.chain(held, self.kept_buffers):
            key = storage_key(tensor) if isinstance(tensor, _Tensor) else None
            if key is not None:
                to_copy.extend(self.by_storage.pop(key, ()))
        if to_copy:
            self._copy(to_copy)
        stale = self.stale
        for kept in self.by_storage.values():  # plain loops: one storage per activation, mostly
            for entry, version in kept:
                if entry.activation._version != version:
                    stale.append(entry)
        self.by_storage = {}
        return stale

    def _copy(self, kept: List[Tuple[TensorLogEntry, int]]) -> None:
        """Give each entry of ``kept`` its own copy (one copy of each view held by several), or
        list it as stale where its memory changed already (a write the tracer did not see)."""
        sources: List[torch.Tensor] = []
        place: Dict[Any, int] = {}  # view -> its place in sources
        owners: List[Tuple[TensorLogEntry, int]] = []
        for entry, version in kept:
            saved = entry.activation
            if saved._version != version:
                self.stale.append(entry)
                continue
            view = _view_key(saved)
            at = place.get(view)
            if at is None:
                at = place[view] = len(sources)
                sources.append(saved)
            owners.append((entry, at))
        made = copies(sources)
        for entry, at in owners:
            entry.activation = made[at]


def _view_key(t: torch.Tensor) -> Any:
    """What makes two saved tensors the same values: the object itself where it carries autograd
    history (its copy keeps that history), else where its view of the memory lies (an output
    saved both as its operation's and as the model's output: one copy of a large logits tensor,
    not two)."""
    if t.requires_grad:
        return id(t)
    return (t.data_ptr(), t.dtype, t.shape, t.stride())


__all__ = ["CPU_COPIES_AT_ONCE", "SharedActivations", "copies", "storage_key"]
