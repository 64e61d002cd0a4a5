"""The step timeline of a watched run: when each logged step's forward, backward and optimizer
step ran, and how long the watch itself worked in it (``run.export("steps.json",
format="chrome_trace")`` shows it in Perfetto).

Times are ``time.perf_counter_ns()`` relative to the run's start (meta ``timeline_origin`` holds
the start on that clock). Rows go to the run's ``timeline`` table with the step's next write (no
transaction of their own), each ``(step, thread, phase, start_ns, end_ns, busy_ns)``:

- ``training`` thread: ``forward`` (the root module's pre-hook to the end of its post-hook),
  ``backward`` (the first gradient reaching the model to the end of the backward pass),
  ``optimizer`` (``optimizer.step()`` between the watch's pre and post hooks), and ``watch``
  slices (the watch's own hooks on the model and the optimizer, and its waits for the writer);
  ``hooks``: the recorder's module and gradient hooks outside those slices, from the first to
  the last, ``busy_ns`` their summed time (a sum, not a span).
- ``writer`` thread: ``write``, each write of the step (binning and the transaction).

Example:
    >>> import tempfile, torch, torchlens as tl
    >>> from torchlens.train.store import read_timeline
    >>> model, folder = torch.nn.Linear(3, 2), tempfile.mkdtemp()
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with tl.watch(model, run_dir=folder, backend=(), verbose=False):
    ...     model(torch.rand(4, 3)).sum().backward()
    ...     opt.step()
    >>> sorted({r.phase for r in read_timeline(tl.open_run(folder)) if r.thread == "training"})
    ['backward', 'forward', 'hooks', 'optimizer', 'watch']
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional

from ..store import TimelineRow

_now = time.perf_counter_ns


class StepTimeline:
    """Collects the rows of the logged steps on the training thread (a few ``perf_counter_ns``
    calls per step); the writer takes them with its next write (``take``)."""

    def __init__(self, origin: int, enabled: bool = True) -> None:
        self.origin = origin
        self.enabled = enabled  # off on ranks that write no run (nothing would take the rows)
        self._rows: List[TimelineRow] = []
        self._lock = threading.Lock()  # the writer thread takes what the training thread adds
        self._forward: Optional[tuple] = None  # (step, start) of the forward in flight
        self._backward: Optional[tuple] = None
        self._optimizer: Optional[list] = None  # [step, outer start, inner start, inner end]
        self._inside = 0  # in a watch slice: the recorder's hooks there are not counted twice
        self._hooks: Optional[list] = None  # [step, first start, last end, summed ns]

    def add(self, step: int, phase: str, start: int, end: int, thread: str = "training") -> None:
        """A span measured with ``perf_counter_ns`` (absolute: the origin is taken off here)."""
        if self.enabled:
            row = TimelineRow(
                int(step), thread, phase, start_ns=start - self.origin, end_ns=max(end, start) - self.origin
            )
            with self._lock:
                self._rows.append(row)

    def take(self) -> List[TimelineRow]:
        """The rows not written yet (and the hooks' sum of a step that has ended)."""
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    # ----- the phases ------------------------------------------------------------------------
    def forward_started(self, step: int, start: int) -> None:
        self._forward = (step, start)

    def forward_ended(self) -> None:
        if self._forward is not None:
            step, start = self._forward
            self._forward = None
            self.add(step, "forward", start, _now())

    def backward_started(self, step: int) -> None:
        if self._backward is None:
            self._backward = (step, _now())

    def backward_ended(self, step: int, end: int) -> None:
        if self._backward is not None:
            first, start = self._backward
            self._backward = None
            if first == step:
                self.add(step, "backward", start, end)

    def optimizer_pre(self, step: Optional[int], outer: bool) -> None:
        """The watch's first (``outer``) and last optimizer pre-hook; the hooks between them
        (the ``updates`` copies) are watch work."""
        now = _now()
        if outer:
            self._optimizer = None if step is None else [step, now, None, None]
        elif self._optimizer is not None:
            self._optimizer[2] = now

    def optimizer_post_inner(self) -> None:
        if self._optimizer is not None:
            self._optimizer[3] = _now()

    def optimizer_ended(self, start: int) -> None:
        """The watch's last post-hook ran from ``start`` to now."""
        if self._optimizer is None:
            return
        step, outer, inner, done = self._optimizer
        self._optimizer = None
        end = _now()
        begin = inner if inner is not None else outer
        if inner is not None:
            self.add(step, "watch", outer, inner)
        done = done if done is not None else start
        self.add(step, "optimizer", begin, done)
        self.add(step, "watch", done, end)

    # ----- the watch's own work --------------------------------------------------------------
    def enter(self) -> int:
        """A watch slice begins (returns its start for ``leave``)."""
        self._inside += 1
        return _now()

    def leave(self, step: Optional[int], start: int) -> None:
        self._inside -= 1
        if step is not None:
            self.add(step, "watch", start, _now())

    def timed(self, hook: Callable[..., Any], step_of: Callable[[], Optional[int]]) -> Callable[..., Any]:
        """``hook`` with its time added to its step's ``hooks`` sum (``step_of()`` names the
        step; outside a logged step nothing is counted)."""

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self._inside or not self.enabled:
                return hook(*args, **kwargs)
            start = _now()
            try:
                return hook(*args, **kwargs)
            finally:  # inlined: this runs for every hook call of a logged step
                step = step_of()
                if step is not None:
                    end = _now()
                    h = self._hooks
                    if h is not None and h[0] == step:
                        h[2] = end
                        h[3] += end - start
                    else:
                        self._first_hook(step, start, end)

        return counted

    def _first_hook(self, step: int, start: int, end: int) -> None:
        """The first counted hook of ``step``: the last step's sum becomes a row."""
        self.flush_hooks()
        self._hooks = [step, start, end, end - start]

    def flush_hooks(self) -> None:
        """The hooks' sum of the step counted last becomes a row (when its step ends)."""
        h, self._hooks = self._hooks, None
        if h is not None and self.enabled:
            row = TimelineRow(
                h[0], "training", "hooks", start_ns=h[1] - self.origin, end_ns=h[2] - self.origin, busy_ns=h[3]
            )
            with self._lock:
                self._rows.append(row)


def optimizer_hooks(optimizers: List[Any], pre: Optional[Callable] = None, post: Optional[Callable] = None) -> list:
    """Register ``pre``/``post`` as step hooks of ``optimizers``, or of every optimizer when
    none is given (torch's global hooks); returns the handles."""
    handles = []
    if optimizers:
        for opt in optimizers:
            handles += [opt.register_step_pre_hook(pre)] if pre is not None else []
            handles += [opt.register_step_post_hook(post)] if post is not None else []
        return handles
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    handles += [register_optimizer_step_pre_hook(pre)] if pre is not None else []
    handles += [register_optimizer_step_post_hook(post)] if post is not None else []
    return handles


__all__ = ["StepTimeline", "optimizer_hooks"]
