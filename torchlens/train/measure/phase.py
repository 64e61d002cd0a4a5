"""A logged step's tensors kept until the end of their phase, then measured together (on the
CPU: copied together, and measured on the watch's writer thread; see ``PhaseMeasure``).

The hooks hand each tensor to ``PhaseMeasure.add`` (no kernel: a reference and its version);
``flush`` at the end of the phase (the forward pass, the backward pass's parameter gradients,
the optimizer step) measures them all with ``measure_batch`` and moves the phase's table of
``EXACT_FIELDS`` to the host once, into pinned memory without waiting; the writer thread waits
on the copy's event when it reads a summary (``Measured.summary``).

A tensor changed in place after it was seen (an output that ``ReLU(inplace=True)`` or
``out += identity`` overwrites) cannot be measured at the phase's end: such places are learned.
The first time a place is seen, and every time after it was found changed, its tensor is copied
when seen (one kernel), and the copies are measured early, together, once they hold more than
``budget`` bytes; a place whose tensor is found unchanged at the end of its phase is read in
place from then on. A tensor found changed where that was not expected gets no values in that
step (its series says nothing rather than something false); its place is copied from then on.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Set

import torch

from ...web.stats import Row, Summary
from .batch import Batch, measure_batch
from .exact import LazySummary, kept_dtype
from .layout import LayoutCache, tensor_key

Place = Hashable  # where a tensor was seen (the recorder's series key)
_UNKNOWN: Any = object()  # a key not given


class Measured(LazySummary):
    """A tensor measured with its phase: ``sample`` (float32, on its device) and ``summary``
    (its ``EXACT_FIELDS`` on the host, read once the phase's copy has arrived: reading waits for
    it) are set when the phase is flushed, as a ``Piece`` of the phase's samples and a ``Row``
    of its host table: viewed when read, or handed on as they lie (``sample_ref``,
    ``summary_ref``) to the writer thread, which makes no view per tensor."""

    __slots__ = ("event",)

    def __init__(self, values: torch.Tensor) -> None:
        # every slot of LazySummary's, set here rather than by its __init__ (a logged step makes
        # one per tensor it measures: a second call, and the summary setter's, cost as much)
        self.values: Optional[torch.Tensor] = values
        self.then = self.release = self.draw = self._summary = self._sample = None
        self.event: Any = None  # the phase's copy to the host, until it has arrived

    def _arrived(self) -> None:
        event = self.event
        if event is not None:
            event.synchronize()  # waits for this copy alone: not a device synchronisation
            self.event = None

    @property  # type: ignore[override]
    def summary(self) -> Optional[torch.Tensor]:  # noqa: D401 - LazySummary's, behind a wait
        self._arrived()
        return LazySummary.summary.fget(self)  # type: ignore[attr-defined,no-any-return]

    @summary.setter
    def summary(self, row: Summary) -> None:
        self._summary = row

    def summary_ref(self) -> Summary:
        self._arrived()
        return self._summary


class _Entry:
    __slots__ = ("tensor", "version", "address", "copy", "places", "measured", "key")

    def __init__(self, tensor: torch.Tensor, measured: Measured, key: Any) -> None:
        self.tensor: Optional[torch.Tensor] = tensor
        self.key = key  # the tensor's ``tensor_key`` (its copy's, once copied)
        self.version = tensor._version
        self.address = _address(tensor)
        self.copy: Optional[torch.Tensor] = None
        self.places: List[Place] = []
        self.measured = measured

    def unchanged(self) -> bool:
        t = self.tensor
        return t is not None and t._version == self.version and _address(t) == self.address


class PhaseMeasure:
    """The tensors of a logged step's phase awaiting their batched measurement.

    ``generator(device)``: the sampler's generator there; ``sample_n``: values per sample.

    Example:
        >>> pm = PhaseMeasure(3, lambda d: None)
        >>> m = pm.add(torch.tensor([1.0, 2.0]), place="a")
        >>> pm.flush(); m.summary[1].item(), m.sample.tolist()
        (1.5, [1.0, 2.0])
    """

    def __init__(
        self,
        sample_n: Optional[int],
        generator: Callable[[torch.device], Optional[torch.Generator]],
        budget: int = 256 << 20,
        later: Optional[Callable[[Sequence[torch.Tensor]], List[Optional[torch.Tensor]]]] = None,
    ) -> None:
        """``later``: for tensors on the CPU, measured on the watch's writer thread: at the end of
        the phase each ``Measured`` gets a copy of its values (one ``cat`` per dtype for all of
        them) to be measured there, and ``later`` to draw its samples (``Sampler.values_of``)."""
        self.sample_n = sample_n
        self.generator = generator
        self.later = later
        self.layouts = LayoutCache()  # a phase's layout, kept while its tensors keep their signature
        self.budget = budget  # bytes of copies held before they are measured
        self.known: Set[Place] = set()  # places seen at the end of a phase
        self.risky: Set[Place] = set()  # places whose tensor was changed in place after it was seen
        self._pending: List[_Entry] = []
        self._entry_of: Dict[int, _Entry] = {}  # id(measured) -> its pending entry (which keeps it alive)
        self._watched: List[_Entry] = []  # copied entries measured early: checked at the phase's end
        self._copied = 0  # bytes of copies pending

    def add(self, tensor: torch.Tensor, place: Optional[Place] = None, key: Any = _UNKNOWN) -> Measured:
        """Hold ``tensor`` (seen at ``place``) for the phase's measurement; its results arrive
        in the returned ``Measured`` when the phase is flushed. ``key``: its ``tensor_key``,
        where the caller has it already."""
        t = tensor  # not detached (one view per tensor): what is done with it runs without grad
        entry = _Entry(t, Measured(t), tensor_key(t) if key is _UNKNOWN else key)
        self._pending.append(entry)
        self._entry_of[id(entry.measured)] = entry
        if place is not None:
            self.seen_at(entry.measured, place, entry)
        return entry.measured

    def seen_at(self, measured: Measured, place: Place, entry: Optional[_Entry] = None) -> None:
        """``measured``'s tensor (unchanged) is also seen at ``place``: copied now if that place
        is new or was found changed before."""
        if entry is None:
            entry = self._entry_of.get(id(measured))
            if entry is None:
                return
        entry.places.append(place)
        if entry.copy is None and entry.tensor is not None and (place in self.risky or place not in self.known):
            with torch.no_grad():
                entry.copy = entry.tensor.clone()
            entry.key = tensor_key(entry.copy)  # a clone of a tensor with gaps has none
            self._copied += entry.copy.numel() * entry.copy.element_size()
            if self._copied > self.budget:
                self.flush(phase_end=False)

    @torch.no_grad()
    def flush(self, phase_end: bool = True) -> None:
        """Measure what is pending (with ``phase_end=False``: only the copies, to free them)."""
        if phase_end:
            todo, self._pending, self._entry_of = self._pending, [], {}
        else:
            todo = [e for e in self._pending if e.copy is not None]
            self._pending = [e for e in self._pending if e.copy is None]
            self._entry_of = {id(e.measured): e for e in self._pending}
        if phase_end:
            for entry in self._watched + todo:
                same = entry.unchanged()
                self.known.update(entry.places)
                if not same:
                    self.risky.update(entry.places)
                if entry.copy is None and not same:
                    entry.tensor = None  # changed before it was measured: no values this step
            self._watched = []
        else:
            self._watched += todo
        self._copied = 0 if phase_end else self._copied - sum(e.copy.numel() * e.copy.element_size() for e in todo)  # type: ignore[union-attr]
        results: List[Measured] = []
        sources: List[torch.Tensor] = []
        keys: List[Any] = []
        lost: List[_Entry] = []
        for e in todo:  # one pass: this runs at the end of every phase, over all its tensors
            source = e.copy if e.copy is not None else e.tensor
            if source is None:
                lost.append(e)
            else:
                results.append(e.measured)
                sources.append(source)
                keys.append(e.key)
        self._deliver(results, sources, keys=tuple(keys))
        for entry in todo:
            entry.copy = None
            if phase_end:
                entry.tensor = None
        for entry in lost:
            m = entry.measured
            device = m.values.device if m.values is not None else torch.device("cpu")
            m.sample = torch.empty(0, dtype=torch.float32, device=device)
            m.summary, m.values = None, None

    def measure_now(
        self, tensors: Sequence[torch.Tensor], line: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
    ) -> List[Measured]:
        """Measure ``tensors`` at once, together (a phase of their own); ``line(table)``: the
        line of each row of the device table (all ``tensors`` on one device), before it is copied."""
        out = [Measured(t.detach()) for t in tensors]
        self._deliver(out, [t.detach() for t in tensors], line)
        return out

    def clear(self) -> None:
        """Forget what is pending (a step that ended half-way: nothing of it is measured)."""
        self._pending, self._watched, self._copied, self._entry_of = [], [], 0, {}

    def _deliver(
        self,
        measured: List[Measured],
        sources: List[torch.Tensor],
        line: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
        keys: Optional[tuple] = None,
    ) -> None:
        if not measured:
            return
        if self.later is not None:
            if line is not None:  # the rows are measured on the writer thread, after this returns
                raise ValueError("PhaseMeasure(later=...) measures on the writer thread: it takes no line")
            _copy_for_later(measured, sources, self.later)
            return
        batch: Batch = measure_batch(sources, self.sample_n, self.generator, self.layouts, keys=keys)
        host: Dict[torch.device, tuple] = {}
        for device, table in batch.tables.items():
            if line is not None:
                table[:, 9] = line(table)
            host[device] = _to_host(table)
        for m, where, piece in zip(measured, batch.where, batch.pieces):
            if where is None:  # not measurable in a batch (e.g. complex): as the per-tensor path does
                m.summary, m.sample, m.values = None, None, None
                continue
            rows, event = host[where[0]]
            m._sample, m._summary, m.event = piece, Row(rows, where[1]), event
            m.values = None  # after the results: the writer thread reads ``measured``, then ``summary``


def _copy_for_later(measured: List[Measured], sources: List[torch.Tensor], draw: Callable) -> None:
    """Give each ``Measured`` a 1-D copy of its source's values, to be measured later: the copies
    of all sources of one dtype made by one ``cat`` (a fixed number of operations, not one per
    tensor), in the dtype ``measure`` keeps its copies in (``kept_dtype``)."""
    by_dtype: Dict[torch.dtype, List[int]] = {}
    for i, source in enumerate(sources):
        by_dtype.setdefault(source.dtype, []).append(i)
    for dtype, indices in by_dtype.items():
        flat = torch.cat([sources[i].reshape(-1) for i in indices])
        flat = flat.to(kept_dtype(dtype, flat.device))
        for i, values in zip(indices, flat.split([sources[i].numel() for i in indices])):
            m = measured[i]
            m.values, m.draw, m.summary, m.event = values, draw, None, None


def _to_host(table: torch.Tensor) -> tuple:
    """The table on the host: a pinned copy made without waiting, and the event that says it
    has arrived (None on the CPU)."""
    if table.device.type != "cuda":
        return table, None
    host = torch.empty(table.shape, dtype=table.dtype, pin_memory=True)
    host.copy_(table, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(table.device))
    return host, event


def _address(t: torch.Tensor) -> int:
    """Where ``t``'s values are: FSDP frees a parameter by shrinking its storage to nothing, which
    moves it (asking for the storage itself would give the tensor a Python storage object, one
    more object for the garbage collector per tensor for as long as the tensor lives)."""
    try:
        return t.data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage to speak of
        return -1


__all__ = ["Measured", "PhaseMeasure"]
