"""Which tensors existed when a pass began: those are constants of the pass, never gaps.

A tensor that reaches a logged operation without a record is either a constant (it existed
before the pass: held by a module, a global, a closure cell, a default argument, a class, or
anything else the model reaches) or a gap (a call torchlens did not log made it during the
pass). Listing the places a constant can live never ends; asking the garbage collector is
exact, because every tensor object is tracked by it from creation to death.

It is also cheap. ``gc.freeze()`` at the start moves every tracked object into the permanent
generation in constant time, so from then on the collector's generations hold only objects
created during the pass; ``gc.unfreeze()`` at the end puts the frozen objects back (into the
oldest generation). Nothing is walked unless an unrecorded tensor shows up, and then only the
objects made since the start.

A process that froze objects itself (``gc.get_freeze_count() > 0``, e.g. before forking
workers) would have its own freeze undone by ``gc.unfreeze()``. There the pass does not
freeze: it notes the tensors outside the permanent generation at the start instead (a walk
over the unfrozen objects, once per pass); the answer is just as exact.
"""

from __future__ import annotations

import gc
import sysconfig
import weakref
from typing import Dict

import torch

_Tensor = torch.Tensor
_GENERATIONS = (0, 1, 2)  # youngest first: a tensor just made by an untraced call is found soonest
# On a free-threaded build, freezing marks every object (no constant-time list move), and what
# get_objects then reports is not settled: take the notes instead.
_CAN_FREEZE = not sysconfig.get_config_var("Py_GIL_DISABLED")


class PassStart:
    """The moment a pass began. ``existed(t)``: was tensor ``t`` alive then? ``end()`` must
    follow (in a ``finally``): it puts the collector back as it was."""

    def __init__(self) -> None:
        self.froze = _CAN_FREEZE and gc.get_freeze_count() == 0
        # without a freeze of our own: the tensors in the generations now, by id (weakly: the
        # pass must not keep alive what the model drops)
        self.unfrozen: Dict[int, weakref.ref] = {}
        if self.froze:
            gc.freeze()
        else:
            self.unfrozen = _tensors_in_generations()

    def existed(self, tensor: torch.Tensor) -> bool:
        noted = self.unfrozen.get(id(tensor))
        if noted is not None and noted() is tensor:
            return True
        # in the generations now: created after the freeze (ours or the process's own)
        return not _in_generations(tensor)

    def end(self) -> None:
        if self.froze:
            self.froze = False
            gc.unfreeze()
        self.unfrozen = {}


def _in_generations(obj: object) -> bool:
    """Whether ``obj`` is in one of the collector's generations, i.e. not frozen. An id is
    enough: ``obj`` is alive, so no other live object has its address."""
    target = id(obj)
    return any(target in map(id, gc.get_objects(generation)) for generation in _GENERATIONS)


def _tensors_in_generations() -> Dict[int, weakref.ref]:
    return {id(o): weakref.ref(o) for o in gc.get_objects() if issubclass(type(o), _Tensor)}


__all__ = ["PassStart"]
