"""``tl.watch`` and a watched step: the user's call (``session``), its options checked once
(``options``), a step's life as states and one transition table (``state``), the step's clock
(``timeline``) and the thread that writes each logged step (``writer``).

Example:
    >>> import tempfile, torch
    >>> from torchlens.train.step import watch
    >>> model = torch.nn.Linear(3, 2)
    >>> with watch(model, run_dir=tempfile.mkdtemp(), backend=(), verbose=False) as w:
    ...     model(torch.rand(4, 3)).sum().backward()
    >>> w.steps_logged
    1
"""

from .options import WatchOptions
from .session import Watch, attach, unwatch, watch
from .state import TRANSITIONS, StepEvent, StepMachine, StepState, StepTransitionError
from .timeline import StepTimeline, optimizer_hooks
from .writer import StepSink, StepWriter

__all__ = [
    "watch",
    "unwatch",
    "attach",
    "Watch",
    "WatchOptions",
    "StepState",
    "StepEvent",
    "TRANSITIONS",
    "StepMachine",
    "StepTransitionError",
    "StepTimeline",
    "optimizer_hooks",
    "StepWriter",
    "StepSink",
]
