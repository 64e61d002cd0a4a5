"""A watched training step's life: its states (``StepState``), the events that move it
(``StepEvent``) and the one table of which event moves which state where (``TRANSITIONS``).
``StepMachine`` holds the step in progress and is the only place where its state changes.

A step begins (``LOGGED`` or ``UNLOGGED``, by ``log_freq``), a logged step records its forward
passes (``FORWARD``) and awaits the end of each backward pass (``BACKWARD``); the two overlap when
a forward runs inside a backward pass or a backward inside a forward (activation checkpointing,
``torch.autograd.grad`` in ``forward``): ``FORWARD_AND_BACKWARD``. A step ends when the next one
begins, at ``flush()`` or when the watch closes (``IDLE``). An event the table does not list
for the state is a bug of the watch: ``StepTransitionError``.

Example:
    >>> m = StepMachine(log_freq=2)
    >>> m.begin(0, ready=True).name, m.apply(StepEvent.FORWARD_STARTED).name
    ('LOGGED', 'FORWARD')
    >>> m.apply(StepEvent.BACKWARD_STARTED).name, m.apply(StepEvent.FORWARD_ENDED).name
    ('FORWARD_AND_BACKWARD', 'BACKWARD')
    >>> m.finish(), m.begin(m.next_step, ready=True).name
    ((0, True), 'UNLOGGED')
    >>> m.apply(StepEvent.FORWARD_ENDED)
    Traceback (most recent call last):
    ...
    torchlens.train.step.state.StepTransitionError: torchlens.train: a watched step cannot go from UNLOGGED on forward_ended (step 1). This is a bug of torchlens; please report it.
"""

from __future__ import annotations

import enum
from typing import Any, Dict, List, Optional, Tuple

from ...errors import TorchlensError


class StepState(enum.Enum):
    # members are singletons: hashed by identity, in C (Enum's own hash is a Python call, and
    # the hooks ask for the state hundreds of times a step)
    __hash__ = object.__hash__

    IDLE = "idle"  # no step in progress: before the first, after one ended
    UNLOGGED = "unlogged"  # a step in progress that is not logged
    LOGGED = "logged"  # a logged step between its passes
    FORWARD = "forward"  # a logged step's forward pass being recorded
    BACKWARD = "backward"  # a logged step's backward pass in flight: its end is awaited
    FORWARD_AND_BACKWARD = "forward_and_backward"  # both at once


class StepEvent(enum.Enum):
    __hash__ = object.__hash__  # as StepState's

    BEGIN_LOGGED = "begin_logged"  # a step begins that is logged
    BEGIN_UNLOGGED = "begin_unlogged"  # a step begins that is not
    FORWARD_STARTED = "forward_started"  # the model's own training forward begins (recorded)
    FORWARD_ENDED = "forward_ended"  # that forward ended
    BACKWARD_STARTED = "backward_started"  # the first gradient of a backward pass arrived
    BACKWARD_ENDED = "backward_ended"  # the autograd engine ended that pass
    FINISHED = "finished"  # the step ended (the next begins, flush, close)


S, E = StepState, StepEvent
_ANY = tuple(StepState)

# (state, event) -> the next state. Nothing else changes a step's state.
TRANSITIONS: Dict[Tuple[StepState, StepEvent], StepState] = {
    (S.IDLE, E.BEGIN_LOGGED): S.LOGGED,
    (S.IDLE, E.BEGIN_UNLOGGED): S.UNLOGGED,
    (S.LOGGED, E.FORWARD_STARTED): S.FORWARD,
    (S.BACKWARD, E.FORWARD_STARTED): S.FORWARD_AND_BACKWARD,
    # a forward whose end the hooks did not see (it ran compiled code): the next one records anew
    (S.FORWARD, E.FORWARD_STARTED): S.FORWARD,
    (S.FORWARD_AND_BACKWARD, E.FORWARD_STARTED): S.FORWARD_AND_BACKWARD,
    (S.FORWARD, E.FORWARD_ENDED): S.LOGGED,
    (S.FORWARD_AND_BACKWARD, E.FORWARD_ENDED): S.BACKWARD,
    (S.LOGGED, E.BACKWARD_STARTED): S.BACKWARD,
    (S.FORWARD, E.BACKWARD_STARTED): S.FORWARD_AND_BACKWARD,
    (S.BACKWARD, E.BACKWARD_ENDED): S.LOGGED,
    (S.FORWARD_AND_BACKWARD, E.BACKWARD_ENDED): S.FORWARD,
    # the end of a pass whose step number came back (manual steps, the same n after a flush)
    (S.LOGGED, E.BACKWARD_ENDED): S.LOGGED,
    (S.FORWARD, E.BACKWARD_ENDED): S.FORWARD,
    **{(state, E.FINISHED): S.IDLE for state in _ANY},
}

_LOGGED = frozenset({S.LOGGED, S.FORWARD, S.BACKWARD, S.FORWARD_AND_BACKWARD})


class StepTransitionError(TorchlensError, RuntimeError):
    """The watch applied an event its step's state does not take (a bug of torchlens)."""


class StepMachine:
    """The step in progress of one watch: its number, its state, and what the watch needs to
    know of it (a backward reached the model, the optimizer stepped, the model's nested calls,
    its forwards with manual steps). The watch changes it through ``begin``, ``apply`` and
    ``finish`` only."""

    def __init__(self, log_freq: int) -> None:
        self.log_freq = log_freq
        self.state = StepState.IDLE
        self.step: Optional[int] = None  # the training step in progress
        self.next_step = 0  # the number the next step gets (without manual steps)
        self.backward_seen = False  # a backward pass reached the model's outputs in this step
        self.stepped = False  # an optimizer step ended it (with the optimizers known)
        self.model_forwards = 0  # with manual steps: forwards of the model since begin_step
        self.depth = 0  # calls of the model in progress (it may call itself)
        self.markers: List[Any] = []  # gradient hooks on the model's outputs (their handles)

    # ----- reading ------------------------------------------------------------------------
    @property
    def logging(self) -> bool:
        """Whether the step in progress is logged."""
        return self.state in _LOGGED

    @property
    def recording(self) -> bool:
        """Whether a logged forward is being recorded."""
        return self.state in (S.FORWARD, S.FORWARD_AND_BACKWARD)

    @property
    def awaiting_backward(self) -> bool:
        """Whether the end of a logged backward pass is awaited (a callback is queued)."""
        return self.state in (S.BACKWARD, S.FORWARD_AND_BACKWARD)

    def logged_step(self) -> Optional[int]:
        """The step in progress when it is logged, else None."""
        return self.step if self.state in _LOGGED else None  # ``logging`` inlined: every hook asks

    def wants_log(self, step: int) -> bool:
        """Whether step ``step`` is one ``log_freq`` logs."""
        return step % self.log_freq == 0

    # ----- changing -----------------------------------------------------------------------
    def apply(self, event: StepEvent) -> StepState:
        """Move the state by ``event`` (``TRANSITIONS``); an event the state does not take raises."""
        after = TRANSITIONS.get((self.state, event))
        if after is None:
            raise StepTransitionError(
                f"torchlens.train: a watched step cannot go from {self.state.name} on {event.value} "
                f"(step {self.step}). This is a bug of torchlens; please report it."
            )
        self.state = after
        return after

    def begin(self, step: int, ready: bool) -> StepState:
        """Step ``step`` begins (the last one has finished): logged when ``log_freq`` says so and
        the hooks can run (``ready``)."""
        self.step, self.next_step = step, step + 1
        self.backward_seen = self.stepped = False
        self.model_forwards = 0
        logged = self.wants_log(step) and ready
        return self.apply(StepEvent.BEGIN_LOGGED if logged else StepEvent.BEGIN_UNLOGGED)

    def finish(self) -> Tuple[Optional[int], bool]:
        """The step in progress ends: (its number, whether it was logged); its markers go."""
        self.remove_markers()
        ended = (self.step, self.logging)
        self.step = None
        self.apply(StepEvent.FINISHED)
        return ended

    def enter_call(self) -> bool:
        """A call of the model begins: whether it is the outermost one."""
        self.depth += 1
        return self.depth == 1

    def leave_call(self) -> bool:
        """A call of the model ended: whether it was the outermost one."""
        self.depth = max(self.depth - 1, 0)
        return self.depth == 0

    def add_marker(self, handle: Any) -> None:
        self.markers.append(handle)

    def remove_markers(self) -> None:
        for h in self.markers:
            h.remove()
        self.markers = []

    def continues(self, optimizers_known: bool, delay: bool) -> bool:
        """Whether a training forward belongs to the step in progress: with the optimizer known,
        until it steps (gradient accumulation, two forwards per update); with
        ``delay_log_multibackward``, until a backward pass has come."""
        if self.step is None:
            return False
        if optimizers_known:
            return not self.stepped
        return delay and not self.backward_seen


__all__ = ["StepState", "StepEvent", "TRANSITIONS", "StepMachine", "StepTransitionError"]
