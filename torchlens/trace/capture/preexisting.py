"""Which tensors existed when a pass began: those are constants of the pass, never gaps.

A tensor that reaches a logged operation without a record is either a constant (it existed
before the pass: held by a module, a global, a closure cell, a default argument, a class, or
anything else the model reaches) or a gap (a call torchlens did not log made it during the
pass). Listing the places a constant can live never ends; the garbage collector already keeps
the answer, because it files every tensor object by age from creation to death:

- a new object is appended to the youngest generation's list, so a marker appended when the
  pass starts divides that list into older objects (before it) and the pass's own (after it);
- objects leave the youngest generation only in a collection, and every collection first calls
  ``gc.callbacks``: there the pass notes the tensors of its own that are about to be moved on.

So "was it made during the pass?" is "is it in the youngest generation after the marker, or
noted on its way out?", whatever the rest of the process holds (frozen objects, millions of
old objects): nothing older than the pass is ever walked, and the collector is not frozen,
unfrozen or collected. The pass adds one marker and one callback, and removes both. (The pass
also pauses automatic collection while it runs, for speed: see ``run_pass``; then the youngest
generation simply holds all the pass made, and the callback serves explicit collections.)

A build where that filing does not hold (a free-threaded build, where the collector keeps no
generations) falls back to noting the tensors alive at the start, a walk over the heap.
"""

from __future__ import annotations

import gc
import sysconfig
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

_Tensor = torch.Tensor


def _is_tensor(obj: object) -> bool:
    return issubclass(type(obj), _Tensor)  # type(): a proxy's __class__ must not fool the check


class PassStart:
    """The moment a pass began. ``existed(t)``: was tensor ``t`` alive then? ``end()`` must
    follow (in a ``finally``): it removes the pass's marker and collection callback.

    >>> before = torch.zeros(1)
    >>> start = PassStart()
    >>> during = torch.zeros(1)
    >>> start.existed(before), start.existed(during)
    (True, False)
    >>> [t is before for t in start.existing([during, before])]
    [True]
    >>> start.end()
    """

    def __init__(self) -> None:
        self._callback: Optional[Callable[[str, Dict[str, Any]], None]] = None
        self._notes: Optional[Dict[int, weakref.ref[object]]] = None
        # tensors of the pass moved out of the youngest generation by a collection, by id
        # (weakly: the pass must not keep alive what the model drops)
        self._moved_on: Dict[int, weakref.ref[object]] = {}
        if not _generations_kept():
            self._notes = {id(o): weakref.ref(o) for o in gc.get_objects() if _is_tensor(o)}
            return
        self._marker: List[None] = []  # a list is always tracked: appended last, now
        self._marker_moved = False  # by a collection, out of the youngest generation
        self._callback = self._before_collection
        gc.callbacks.append(self._callback)

    def existed(self, tensor: torch.Tensor) -> bool:
        return bool(self.existing((tensor,)))

    def existing(self, tensors: Iterable[torch.Tensor]) -> List[torch.Tensor]:
        """Those of ``tensors`` that were alive when the pass began, with one look at the
        youngest generation however many they are."""
        if self._notes is not None:
            noted = self._notes
            return [t for t in tensors if (ref := noted.get(id(t))) is not None and ref() is t]
        young = gc.get_objects(generation=0)  # a collection this triggers has run its callback
        made = {id(o) for o in self._made_since_start(young) if issubclass(type(o), _Tensor)}
        moved_on = self._moved_on
        return [
            t
            for t in tensors
            if id(t) not in made and not ((moved := moved_on.get(id(t))) is not None and moved() is t)
        ]

    def end(self) -> None:
        if self._callback is not None:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:  # the process cleared gc.callbacks itself
                pass
            self._callback = None
        self._marker_moved = True
        self._moved_on = {}
        self._notes = None

    def _made_since_start(self, young: List[Any]) -> List[Any]:
        """The part of the youngest generation's list made after the start: after the marker
        while it is there, all of it once a collection has moved the marker on."""
        if self._marker_moved:
            return young
        marker = self._marker
        for index in range(len(young) - 1, -1, -1):  # the marker is usually near the end
            if young[index] is marker:
                return young[index + 1 :]
        return young

    def _before_collection(self, phase: str, info: Dict[str, Any]) -> None:
        """Every collection takes the youngest generation: note the pass's tensors in it, which
        the collection moves on if they survive. Must never raise (the collector would print)."""
        if phase != "start" or self._callback is None:
            return
        try:
            young = self._made_since_start(gc.get_objects(generation=0))
            # inline (no call per object): this runs over every object of each collection
            moved = [o for o in young if issubclass(type(o), _Tensor)]
            self._moved_on.update({id(t): weakref.ref(t) for t in moved})
        finally:
            # the marker survives (the pass holds it), so it leaves the youngest generation now,
            # and from then on all of that generation is the pass's own
            self._marker_moved = True


def _generations_kept() -> bool:
    """Whether this interpreter files new objects at the end of the youngest generation, as
    ``PassStart`` relies on; checked once on the running interpreter, not assumed."""
    global _KEPT
    if _KEPT is None:
        _KEPT = not sysconfig.get_config_var("Py_GIL_DISABLED") and _filing_check()
    return _KEPT


_KEPT: Optional[bool] = None


def _filing_check() -> bool:
    for _ in range(3):  # a collection may move them on in between: then look again
        marker: List[None] = []
        new = torch.zeros(0)
        if not (gc.is_tracked(marker) and gc.is_tracked(new)):
            return False
        found = [o for o in gc.get_objects(generation=0) if o is marker or o is new]
        if len(found) == 2:
            return found[0] is marker
    return False


__all__ = ["PassStart"]
