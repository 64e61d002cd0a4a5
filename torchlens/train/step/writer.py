"""Writing a logged step as soon as it can be read: when its backward pass ends (not only when
the next step starts), again when a later backward pass of the same step or its optimizer step
(``updates``) adds to it, and a last time when the step ends if anything changed since.

The hooks take each step's samples and exact statistics on the training thread (they must see
the tensors before anything changes them). Binning the samples, moving them to the host and the
database transaction run on a writer thread of the watch, in order, so training goes on
meanwhile (and on a GPU never waits for the copy to the host). Under ``torch.distributed`` a
step's histograms are global, made by collectives that must keep their order on every rank:
there the write stays on the training thread. ``wait()`` returns when all is written, as does a
``fork()`` (the child would otherwise hold whatever lock a write had taken).
The backends (wandb, TensorBoard) get each step once, when it ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from ...web.stats import Histograms, histograms, stack_rows
from ..measure import LazySummary, RankGroup, step_histograms
from ..record import StepData, StepRecorder
from ..store import RunWriter
from .timeline import StepTimeline


@dataclass(frozen=True)
class StepSink:
    """What the step writer needs of its watch: where the steps come from and where they go."""

    recorder: StepRecorder  # hands over each step's data
    run: Optional[RunWriter]  # the run database (None on ranks other than 0)
    ranks: Optional[RankGroup]  # the collectives under torch.distributed
    timeline: StepTimeline  # its rows go with each write
    reject: float  # reject_outlier_proportion
    run_dir: Optional[str]
    backends: List[Any] = field(default_factory=list)  # wandb, TensorBoard: each step once, when it ends
    durable: bool = True  # a step's writes are committed before its optimizer step returns


class StepWriter:
    """Writes the logged steps of one watch (``sink``: what it writes from and to)."""

    def __init__(self, sink: StepSink) -> None:
        self.sink = sink
        self._written = 0  # logged steps written so far
        self._clean: Optional[Tuple[int, int]] = None  # (step, recorder version) last written whole
        self._last: Any = None  # the histograms of that write (set by the writer thread)
        # (step, the recorder's dropped count, key -> (parts, last part, row), histograms) of
        # the forward's series, binned during the backward pass (set by the writer thread)
        self._ahead: Optional[Tuple[Optional[int], int, Dict[Any, Tuple[int, Any, int]], Histograms]] = None
        # a step's writes overlap its own optimizer step only: when that ends (``durable``), and
        # when the next step starts, they are in the run, so a killed process loses at most the
        # step in flight. Never full: a hook handing over work must not wait for the thread.
        self._jobs: "queue.Queue[Optional[Tuple[Callable[[], None], bool]]]" = queue.Queue()
        self._write_room = threading.Semaphore(2)  # one write running and one waiting, at most
        # copies handed over and not measured yet, as they were handed (one list per hand-over):
        # one job measures all there are when it runs, each hand-over on its own, so that their
        # samples are drawn in the same order whatever the thread's timing
        self._to_measure: List[List[LazySummary]] = []
        self._measure_jobs = 0  # measuring jobs queued or running
        self._measured = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.failed = False  # a write failed: the run is not complete (its status says so)

    @property
    def written(self) -> int:
        """Logged steps written so far (waits for the writes under way)."""
        self.wait()
        return self._written

    def update(self, step: int, kinds: Optional[Set[str]] = None) -> None:
        """Write what step ``step`` has now: every series, or those of ``kinds``."""
        recorder = self.sink.recorder
        version = recorder.version
        data = recorder.collect(kinds)
        if kinds is not None and not data.keys:
            return
        self._submit(step, data, keep=kinds is None)
        if kinds is None:
            self._clean = (step, version)

    def updates_added(self, step: int, added: int) -> None:
        """An optimizer step added ``added`` updates: write them (a step not written yet waits)."""
        if self._clean is None or self._clean[0] != step:
            return
        clean_before = self._clean[1] + added == self.sink.recorder.version
        self.update(step, {"updates"})
        if clean_before:
            self._clean = (step, self.sink.recorder.version)
        self.durable()

    def finish(self, step: int, data: StepData) -> None:
        """The step has ended (``data``: the recorder's ``end_step``): write it if it changed
        since it was last written, and hand it to the backends."""
        w = self.sink
        unchanged = self._clean == (step, w.recorder.version)
        self._clean = None
        if not unchanged:
            self._submit(step, data, keep=True)
        self.durable()  # a step that has ended is in the run before the next one runs
        if not w.backends:
            return
        # the last write's histograms (under torch.distributed, global ones: no rank but 0 has
        # backends, so none may run a collective here)
        self.wait()
        h = self._last
        if h is None:
            h = histograms(data.summarize().samples, w.reject, summaries=data.summaries)
        for backend in w.backends:
            backend.log_step(step, data.keys, h, w.run_dir)

    def durable(self) -> None:
        """Return when the writes handed over so far are committed: called when a step's
        optimizer step has ended and when the step ends, so that a process killed afterwards
        (``kill -9``) has every finished step in its run. Not durable (``tl.watch(durable=
        False)``): returns at once (at most two writes wait, see ``_write_room``), raising a
        write that failed meanwhile."""
        if self.sink.durable:
            self.wait()
        else:
            self._raise_failure()

    def wait(self) -> None:
        """Return when every step handed over is written; a write that failed raises here."""
        if self._thread is not None:
            self._jobs.join()
        self._raise_failure()

    def close(self) -> None:
        """Write what is left and stop the writer thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
            _WRITERS.discard(self)
        self._raise_failure()

    # ----- the writing itself ----------------------------------------------------------------
    @property
    def _threaded(self) -> bool:
        """Whether steps are written on the writer thread: not under torch.distributed (the
        collectives keep their order on every rank) and not without a run (other ranks)."""
        return self.sink.ranks is None and self.sink.run is not None

    def measure_ahead(self) -> None:
        """Start measuring what the step has handed over so far (its forward pass's copies) on
        the writer thread, while training goes on (its backward pass): the write at the step's
        end, which training waits for, is then left with the gradients alone."""
        if not self._threaded:  # written on the training thread: nothing to overlap
            return
        recorder = self.sink.recorder
        self.measure_soon(recorder.unmeasured())
        data: Optional[StepData] = recorder.collect()
        if recorder.sampled_on:  # samples on a GPU: binned with the rest, in one go (fewer launches)
            data = None
        step, dropped = recorder.step, recorder.dropped
        with self._measured:  # counted as measuring: ``wait_measured`` waits for it too
            self._measure_jobs += 1
        self._start()
        self._jobs.put((functools.partial(self._bin_ahead, step, data, dropped), False))

    def _bin_ahead(self, step: Optional[int], data: Optional[StepData], dropped: int) -> None:
        """While the backward pass runs (the writer is idle then): the forward's series binned
        (host samples), kept for the write at the pass's end, which bins only what changed
        since; and the log checkpointed."""
        try:
            if self._error is None and data is not None:
                h = histograms(data.summarize().samples, self.sink.reject, summaries=data.summaries)
                known = {
                    key: (n, parts[n - 1], i)
                    for i, (key, parts, n) in enumerate(zip(data.keys, data.parts, data.counts))
                }
                self._ahead = (step, dropped, known, h)
        finally:
            with self._measured:
                self._measure_jobs -= 1
                self._measured.notify_all()
        if self.sink.run is not None:
            self.sink.run.checkpoint()

    def _histograms(self, step: int, data: StepData) -> Histograms:
        """The step's histograms: the rows binned ahead (``_bin_ahead``) whose series have not
        changed since, and the others binned now."""
        w = self.sink
        ahead, self._ahead = self._ahead, None
        if w.ranks is not None or ahead is None or ahead[:2] != (step, w.recorder.dropped):
            return step_histograms(w.ranks, data, w.reject, step)
        data.summarize()
        known, old = ahead[2], ahead[3]
        fresh, reused, rows = [], [], []
        for i, (key, parts, n) in enumerate(zip(data.keys, data.parts, data.counts)):
            k = known.get(key)
            if k is not None and k[0] == n and k[1] is parts[n - 1]:
                reused.append(i)
                rows.append(k[2])
            else:
                fresh.append(i)
        new = histograms([data.samples[i] for i in fresh], w.reject, summaries=[data.summaries[i] for i in fresh])
        return stack_rows(len(data.keys), [(fresh, new, list(range(len(fresh)))), (reused, old, rows)])

    def measure_soon(self, lazies: List[LazySummary]) -> bool:
        """Measure ``lazies`` (values nothing changes until they are measured) on the writer
        thread, in turn with the writes; False when steps are written on the training thread
        (they are measured there, when the step is written)."""
        if not self._threaded:
            return False
        if not lazies:
            return True
        with self._measured:
            queued = bool(self._to_measure)  # a job that will take these too is waiting
            self._to_measure.append(list(lazies))
            if not queued:
                self._measure_jobs += 1
        if not queued:
            self._start()
            self._jobs.put((self._measure_handed, False))
        return True

    def run_soon(self, job: Callable[[], None]) -> bool:
        """Run ``job`` on the writer thread after what was handed over before it (an error it
        raises fails the run: ``job`` handles its own); False where steps are written on the
        training thread."""
        if not self._threaded:
            return False
        self._start()
        self._jobs.put((job, False))
        return True

    def wait_measured(self) -> None:
        """Return when everything handed to ``measure_soon`` so far is measured (the writes
        queued meanwhile may still run)."""
        with self._measured:
            self._measured.wait_for(lambda: self._measure_jobs == 0)

    def _measure_handed(self) -> None:
        """Measure every value handed over so far, each hand-over on its own (its small ones in
        one batch)."""
        with self._measured:
            handed, self._to_measure = self._to_measure, []
        try:
            # each hand-over on its own: measured together, the samples of several would be
            # drawn grouped by length, in an order that would depend on how many were waiting
            for lazies in handed:
                LazySummary.resolve(lazies)
        finally:
            with self._measured:
                self._measure_jobs -= 1
                self._measured.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="torchlens-step-writer", daemon=True)
            self._thread.start()
            _WRITERS.add(self)

    def _submit(self, step: int, data: StepData, keep: bool) -> None:
        w = self.sink
        self._raise_failure()
        new_calls = w.recorder.take_new_calls()
        if not self._threaded:  # collectives keep their order on every rank
            try:
                self._write(step, data, new_calls, keep)
            except BaseException:
                self.failed = True
                raise
            return
        streams = _training_streams(w.recorder)

        def job() -> None:
            with contextlib.ExitStack() as stack:  # queued after the work that made the samples
                for stream in streams:
                    stack.enter_context(torch.cuda.stream(stream))
                self._write(step, data, new_calls, keep)

        self._start()
        self._write_room.acquire()
        self._jobs.put((job, True))

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                self._jobs.task_done()
                return
            job, is_write = item
            try:
                if self._error is None or not is_write:  # a measuring job counts down whatever came before
                    job()
            except BaseException as error:  # handed to the training thread at its next write
                self._error = error
            finally:
                if is_write:
                    self._write_room.release()
                self._jobs.task_done()

    def _raise_failure(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            self.failed = True
            raise RuntimeError(f"torchlens.train: writing a logged step to the run failed: {error}") from error

    def _write(self, step: int, data: StepData, new_calls: List[Any], keep: bool) -> None:
        w = self.sink
        start = time.perf_counter_ns()
        if new_calls and w.run is not None:
            w.run.add_calls(new_calls)
        h = self._histograms(step, data)  # global under torch.distributed
        if keep:
            self._last = h
        if w.run is None:  # a rank other than 0: its counts went to rank 0
            return
        new = w.run.write_step(
            step,
            data.keys,
            h.counts,
            h.lo,
            hi=h.hi,
            nonfinite=h.nonfinite,
            reasons=data.reasons,
            exact=h.exact,
            timeline=w.timeline.take(),  # the timeline so far goes with the step's transaction
        )
        self._written += int(new)
        thread = "writer" if threading.current_thread() is self._thread else "training"
        w.timeline.add(step, "write", start, time.perf_counter_ns(), thread=thread)


_WRITERS: "weakref.WeakSet[StepWriter]" = weakref.WeakSet()  # those with a writer thread


def _before_fork() -> None:
    """A fork copies the process as it is, its threads left behind: every writer thread first
    finishes its writes, so the child (a DataLoader's worker) holds no lock a write had taken."""
    for writer in list(_WRITERS):
        if writer._thread is not None:
            writer._jobs.join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


def _training_streams(recorder: StepRecorder) -> List[Any]:
    """The CUDA streams training runs on now, one per device of the step's samples (as the
    recorder noted them when it took them): the writer thread queues its kernels on them, after
    those that computed the samples (another stream could read them before they are written,
    and would need the allocator told of it)."""
    return [torch.cuda.current_stream(d) for d in recorder.sampled_on]


__all__ = ["StepWriter", "StepSink"]
