"""Writing a logged step as soon as it can be read: when its backward pass ends (not only when
the next step starts), again when a later backward pass of the same step or its optimizer step
(``updates``) adds to it, and a last time when the step ends if anything changed since.

Each write computes the step's histograms on the device and moves them, with the exact
statistics, to the host in one transfer, then stores them in one database transaction.
The backends (wandb, TensorBoard) get each step once, when it ends.
"""

from __future__ import annotations

from typing import Any, Optional, Set, Tuple

from ..web.stats import histograms
from .distributed import step_histograms
from .recorder import StepData


class StepWriter:
    """Writes the logged steps of one watch (``watch`` has ``recorder``, ``reject``,
    ``backends``, ``run_dir`` and ``_writer``)."""

    def __init__(self, watch: Any) -> None:
        self.watch = watch
        self.written = 0  # logged steps written so far
        self._clean: Optional[Tuple[int, int]] = None  # (step, recorder version) last written whole
        self._last: Any = None  # the histograms of that write

    def update(self, step: int, kinds: Optional[Set[str]] = None) -> None:
        """Write what step ``step`` has now: every series, or those of ``kinds``."""
        recorder = self.watch.recorder
        version = recorder.version
        data = recorder.collect(kinds)
        if kinds is not None and not data.keys:
            return
        h = self._write(step, data)
        if kinds is None:
            self._clean, self._last = (step, version), h

    def updates_added(self, step: int, added: int) -> None:
        """An optimizer step added ``added`` updates: write them (a step not written yet waits)."""
        if self._clean is None or self._clean[0] != step:
            return
        clean_before = self._clean[1] + added == self.watch.recorder.version
        self.update(step, {"updates"})
        if clean_before:
            self._clean = (step, self.watch.recorder.version)

    def finish(self, step: int, data: StepData) -> None:
        """The step has ended (``data``: the recorder's ``end_step``): write it if it changed
        since it was last written, and hand it to the backends."""
        w = self.watch
        unchanged = self._clean == (step, w.recorder.version)
        self._clean = None
        if unchanged and not w.backends:
            return
        # unchanged: the last write's histograms (under torch.distributed, global ones: no rank
        # but 0 has backends, so none may run a collective here)
        h = self._write(step, data) if not unchanged else self._last
        if h is None:
            h = histograms(data.samples, w.reject, summaries=data.summaries)
        for backend in w.backends:
            backend.log_step(step, data.keys, h, w.run_dir)

    def _write(self, step: int, data: StepData) -> Any:
        w = self.watch
        new_calls = w.recorder.take_new_calls()
        if new_calls and w._writer is not None:
            w._writer.add_calls(new_calls)
        h = step_histograms(w._ranks, data, w.reject, step)  # global under torch.distributed
        if w._writer is None:  # a rank other than 0: its counts went to rank 0
            return h
        new = w._writer.write_step(
            step, data.keys, h.counts, h.lo, hi=h.hi, nonfinite=h.nonfinite, reasons=data.reasons, exact=h.exact
        )
        self.written += int(new)
        return h


__all__ = ["StepWriter"]
