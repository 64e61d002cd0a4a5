"""The one way a feature enters a traced pass: a ``PassHook``.

The tracer records every torch call of the model; what a feature needs on top of that
(replacing a layer's output, choosing another function to run, watching writes, adding up
saved bytes, listening to the pass) it asks through a hook given to ``run_pass(hooks=...)``.
Subclass ``PassHook`` and override what you need; the tracer calls only what a hook overrides,
so an unused method costs the hot path nothing.

The contract, in the order a pass calls it:

- ``pass_started(records)``: once, when torch is patched and before the model runs.
  ``records`` (a ``PassRecords``) is a view of the pass valid until ``pass_ended``: the record
  of a tensor, how many records there are, a ``paused()`` block for the hook's own torch calls,
  and ``before_write(tensor)`` before the hook writes into a tensor of the model.
- ``before_call(name, func, args, kwargs) -> function``: for the wrapped functions named in the
  hook's ``before_calls`` only, before the call runs; return ``func`` to run it, or another function
  to run in its place (whose own torch calls are then logged as the model's).
- ``before_write(tensor)``: a logged call is about to write into ``tensor`` (in place or
  ``out=``).
- ``on_record(entry, tensor) -> tensor``: a new record was made for ``tensor``; return the tensor
  the model goes on with. Returning another tensor replaces it in what the call returns (an
  intervention); to change the value in place, call ``records.before_write(tensor)`` first.
- ``on_save(entry, saved)``: ``saved`` was kept as ``entry``'s activation.
- ``pass_ended()``: once, also when the model raised.

A hook never sees records of its own torch calls when it makes them inside ``records.paused()``.

Example (the smallest hook: count the records a pass makes):
    >>> import torch
    >>> from torchlens.trace.capture import PassHook, SavePlan, run_pass
    >>> class Count(PassHook):
    ...     def pass_started(self, records):
    ...         self.n = 0
    ...     def on_record(self, entry, tensor):
    ...         self.n += 1
    ...         return tensor
    >>> count = Count()
    >>> _ = run_pass(torch.nn.Linear(2, 2), (torch.ones(1, 2),), {}, SavePlan(), random_seed=0, hooks=[count])
    >>> count.n  # input, linear, output
    3
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Protocol, Sequence, Tuple

import torch

from ..records.tensor_log import TensorLogEntry

Call = Callable[..., Any]
Args = Tuple[Any, ...]  # a call's positional arguments
Kwargs = Dict[str, Any]  # a call's keyword arguments
# a hook's before_call: (name, func, args, kwargs) -> the function to run
Chooser = Callable[[str, Call, Args, Kwargs], Call]


class _Writes(Protocol):
    def before_write(self, tensor: torch.Tensor) -> None: ...


class Recording(Protocol):
    """What the view reads of the tracer recording the pass (``capture/tracer.py``)."""

    paused: bool

    @property
    def entries(self) -> List[TensorLogEntry]: ...

    @property
    def shared(self) -> Optional[_Writes]: ...

    def entry_of(self, tensor: torch.Tensor) -> Optional[TensorLogEntry]: ...


class PassRecords:
    """A hook's view of the pass in progress (valid from ``pass_started`` to ``pass_ended``)."""

    __slots__ = ("_tracer",)

    def __init__(self, tracer: Recording) -> None:
        self._tracer = tracer

    def record_of(self, tensor: torch.Tensor) -> Optional[TensorLogEntry]:
        """The record of ``tensor`` if the pass has seen it (made it, or took it in), else None."""
        return self._tracer.entry_of(tensor)

    @property
    def count(self) -> int:
        """How many records the pass has made: the index the next one will get."""
        return len(self._tracer.entries)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Torch calls made in this block are the hook's own: none is recorded."""
        tracer = self._tracer
        was, tracer.paused = tracer.paused, True
        try:
            yield
        finally:
            tracer.paused = was

    @property
    def is_paused(self) -> bool:
        """True while no call is recorded (the tracer's own work, an opaque call, a paused block)."""
        return self._tracer.paused

    def before_write(self, tensor: torch.Tensor) -> None:
        """The hook is about to write into ``tensor``: saved activations sharing its memory get
        their own copies first."""
        shared = self._tracer.shared
        if shared is not None:
            shared.before_write(tensor)


class PassHook:
    """Base class of what enters a pass (see the module docstring for the contract)."""

    #: names of the wrapped functions (``OpInfo.name``) whose calls ``before_call`` sees
    before_calls: FrozenSet[str] = frozenset()

    def pass_started(self, records: PassRecords) -> None:
        """Called once the pass is set up, before the model runs."""

    def before_call(self, name: str, func: Call, args: Args, kwargs: Kwargs) -> Call:
        """The function to run for this call of ``name`` (one of ``before_calls``): ``func`` or another."""
        return func

    def before_write(self, tensor: torch.Tensor) -> None:
        """A logged call is about to write into ``tensor`` (in place or ``out=``)."""

    def on_record(self, entry: TensorLogEntry, tensor: torch.Tensor) -> torch.Tensor:
        """A record was made for ``tensor``; return the tensor the model goes on with."""
        return tensor

    def on_save(self, entry: TensorLogEntry, saved: Any) -> None:
        """``saved`` was kept as ``entry``'s activation."""

    def pass_ended(self) -> None:
        """Called when the pass ends, also when the model raised."""


def overriding(hooks: Sequence[PassHook], method: str) -> List[Any]:
    """The bound ``method`` of each hook whose class overrides it (the others are skipped)."""
    base = getattr(PassHook, method)
    return [getattr(h, method) for h in hooks if getattr(type(h), method) is not base]


def call_choosers(hooks: Sequence[PassHook]) -> Dict[str, List[Chooser]]:
    """Function name -> the ``before_call`` of each hook that asked for it."""
    choosers: Dict[str, List[Chooser]] = {}
    for hook in hooks:
        for name in hook.before_calls:
            choosers.setdefault(name, []).append(hook.before_call)
    return choosers


__all__ = ["Args", "Call", "Chooser", "Kwargs", "PassHook", "PassRecords", "overriding", "call_choosers"]
