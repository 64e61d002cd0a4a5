"""``tl.watch``: record histograms of every module call while a model trains.

The first training forward pass is traced once (metadata only) to get the module-call graph.
Every ``log_freq`` training steps, hooks sample inputs, outputs, their gradients and the
parameters; when its backward pass ends (again if a later backward or the optimizer step adds
to it, ``writer.py``), the step's histograms are computed together on the device and written
to the run database in one transaction. Steps that are not logged cost one hook call on the model itself.
"""

from __future__ import annotations

import atexit
import functools
import sqlite3
import sys
import types
import warnings
from time import perf_counter_ns as _now
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from ...arguments import ArgumentValueError, require_instance, require_str
from ...collector import CollectionPause
from ...web.stats import NUM_BINS
from ..health import Sentinel, SentinelLink
from ..measure import LazySummary, active_group, rank_group
from ..model import CompileSwitch, trace_calls, unwrap
from ..record import ModelHook, RecorderWiring, Sampler, StepRecorder
from ..store import RunWriter, new_run_dir
from .options import DEFAULT_KINDS, WatchOptions
from .state import StepEvent, StepMachine, StepTransitionError
from .timeline import StepTimeline, optimizer_hooks
from .writer import StepSink, StepWriter

_ENGINE = torch.autograd.Variable._execution_engine  # runs callbacks when a backward pass ends


def _calls_running(module: nn.Module) -> int:
    """How many calls of ``module`` are in progress on this thread's stack (its own included)."""
    code, found = nn.Module._call_impl.__code__, 0
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code and frame.f_locals.get("self") is module:
            found += 1
        frame = frame.f_back
    return found


_WATCHES: Dict[int, "Watch"] = {}  # id(watched model) -> its watch
_MODULE_OWNERS: Dict[int, "Watch"] = {}  # id(any watched module) -> the watch (for attach)


class Watch:
    """A model being watched; returned by ``tl.watch``. Close it (or leave a ``with`` block) to
    remove every hook and finish the run. Its wiring: the step machine (``state.py``: every
    change of the step in progress), the recorder's hooks (``record/``), the step writer
    (``writer.py``), the NaN sentinel (``health/``) and the compile switch (``model/``), each
    given only what it needs."""

    def __init__(self, model: nn.Module, options: WatchOptions) -> None:
        self.model = model
        self.options = options
        self.log_freq = options.log_freq
        self.kinds = set(options.kinds)
        self.delay = options.delay_log_multibackward
        self.reject = options.reject_outlier_proportion
        self.verbose = options.verbose
        self.manual_steps = options.manual_steps
        self.backends: list = []  # wandb / tensorboard
        self.url: Optional[str] = None
        self.run_dir: Optional[str] = None
        self.closed = False
        self._server: Any = None  # the explorer server, with backend="standalone"
        self._writer: Optional[RunWriter] = None
        self._root_hooks: list = []
        self._inplace_flags: list = []
        self._tracing: Any = None  # the call recorder of the metadata pass, while it runs
        self._graph_done = False
        self._ranks = rank_group(model)  # under torch.distributed: measure/distributed.py
        self._machine = StepMachine(options.log_freq)  # the step in progress: state.py
        # the step timeline (timeline.py): the recorder's hooks' time is summed per logged step
        self._timeline = StepTimeline(_now(), enabled=False)
        # automatic collection paused while a logged forward runs, as a traced pass does: the
        # step's records, alive until it ends, would be promoted by collections mid-pass, and
        # the full collections that brings walk the whole process (``torchlens/collector.py``)
        self._collector = CollectionPause()
        self._optimizers = list(options.optimizers)  # known: their steps delimit the steps
        self.recorder = self._make_recorder(model, options)
        self._compile = CompileSwitch(model, self.recorder.hide, self._next_logged)  # hooks out of compiled code
        self._sentinel: Optional[Sentinel] = None
        self._steps: Optional[StepWriter] = None
        self._updates: Any = None
        try:
            self._open_outputs(options)
        except BaseException:
            self._release()
            raise
        self._steps = StepWriter(
            StepSink(
                recorder=self.recorder,
                run=self._writer,
                ranks=self._ranks,
                timeline=self._timeline,
                reject=self.reject,
                run_dir=self.run_dir,
                backends=self.backends,
                durable=options.durable,
            )
        )
        link = SentinelLink(
            model=model,
            run_dir=self.run_dir,
            ranks=self._ranks,
            gate=self.recorder.gate,
            logging=self._logging,
            training=self._training,
            flush=self.flush,
        )
        self._sentinel = Sentinel(link, options.on_nonfinite)  # also counts saturated activations
        self._hook_optimizers(options)
        self._hook_model(model, options.disable_inplace)
        if self.verbose:
            where = f"; explorer at {self.url}" if self.url else ""
            print(f"torchlens: watching {type(model).__name__}, run saved in {self.run_dir}{where}", flush=True)

    def _make_recorder(self, model: nn.Module, options: WatchOptions) -> StepRecorder:
        wiring = RecorderWiring(
            gate=lambda: self._tracing is None and self._training(),
            on_gradient=self._gradient_arrived,
            timed=lambda hook: self._timeline.timed(hook, self._machine.logged_step),
            copy_limit=0
            if self._ranks is not None
            else None,  # writes stay on this thread: a copy would only add a pass
            # gradients measured as they arrive; not under torch.distributed, where they are
            # averaged in place after the backward pass
            measure_soon=None if self._ranks is not None else self._measure_soon,
            wait_measured=self._wait_measured,
        )
        sampler = Sampler(options.sample_n)  # one fixed seed: the same training gives the same run
        classes = tuple(options.ignore_io_grad_classes)
        return StepRecorder(unwrap(model), self.kinds, sampler, classes, input_grads=options.input_grads, wiring=wiring)

    def _measure_soon(self, lazies: List[LazySummary]) -> bool:
        return self._steps is not None and self._steps.measure_soon(lazies)

    def _wait_measured(self) -> None:
        if self._steps is not None:
            self._steps.wait_measured()

    def _next_logged(self) -> bool:
        """Whether the next forward is a logged step's (the compile switch asks after each)."""
        m = self._machine
        return not self.manual_steps and (m.wants_log(m.next_step) or (bool(self._optimizers) and m.logging))

    def _open_outputs(self, options: WatchOptions) -> None:
        """The server, the backends and the run folder (rank 0 alone writes the run)."""
        backends = options.backends
        if self._ranks is not None and self._ranks.rank != 0:  # rank 0 writes; the others send it their counts
            backends, self.verbose = (), False  # it traces the graph too: FSDP's gathers need every rank
        if "standalone" in backends:
            from ..serve import ServingProcess

            self._server = ServingProcess(host=options.host, port=options.port)  # bind first: a busy port fails early
        if "wandb" in backends:  # before the run folder exists: no wandb run, no folder
            from ..backends import WandbBackend

            self.backends.append(WandbBackend(html_every=options.wandb_html_every))
        if self._ranks is None or self._ranks.rank == 0:
            name = type(self.model).__name__
            self.run_dir = new_run_dir(options.run_dir, name)
            self._writer = RunWriter(self.run_dir, name, options.stored(), NUM_BINS, max_columns=options.max_columns)
            self._timeline.origin, self._timeline.enabled = self._writer.timeline_origin, True
        if "tensorboard" in backends:
            from ..backends import TensorboardBackend

            self.backends.append(TensorboardBackend(self.run_dir, options.tensorboard_writer))
        if self._server is not None:
            self._server.start(self.run_dir)  # a process of its own: page loads cost training nothing
            self.url = self._server.url

    def _hook_optimizers(self, options: WatchOptions) -> None:
        """The watch's optimizer hooks around the others (the updates' copies are watch work)."""
        pre = functools.partial(self._optimizer_pre, True)
        self._root_hooks += optimizer_hooks(self._optimizers, pre, lambda *_: self._timeline.optimizer_post_inner())
        if "updates" in self.kinds:
            from ..record import UpdateHooks

            machine = self._machine
            logged = lambda: machine.step if machine.logging and self._tracing is None else None  # noqa: E731
            writer = self._steps
            assert writer is not None
            given = None if options.optimizer is None else self._optimizers
            self._updates = UpdateHooks(self.recorder, logged, writer.updates_added, given)
            self._root_hooks += optimizer_hooks(self._optimizers, functools.partial(self._optimizer_pre, False))

    def _hook_model(self, model: nn.Module, disable_inplace: bool) -> None:
        """The model's own hooks (a step begins and ends with its forward), the optimizers' step
        hooks, the registries of ``unwatch`` and ``attach``, and the compile switch."""
        if disable_inplace:
            for m in model.modules():
                if isinstance(getattr(m, "inplace", None), bool) and m.inplace:
                    self._inplace_flags.append(m)
                    m.inplace = False  # type: ignore[assignment]
        # FSDP2: before its pre-forward gathers the root's parameters, so the step's gradient hooks
        # go on the sharded parameters, which receive the gradients
        first = self._ranks is not None and bool(self._ranks.sharded)
        self._root_hooks.append(
            model.register_forward_pre_hook(ModelHook(self._root_pre), with_kwargs=True, prepend=first)
        )
        self._root_hooks.append(
            model.register_forward_hook(ModelHook(self._root_post), with_kwargs=True, always_call=True)
        )
        self._root_hooks += [opt.register_step_post_hook(self._optimizer_stepped) for opt in self._optimizers]
        if not self._optimizers:  # any optimizer's step ends a step's writes (see _make_durable)
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._root_hooks.append(register_optimizer_step_post_hook(self._any_optimizer_stepped))
        _WATCHES[id(model)] = self
        for m in model.modules():
            _MODULE_OWNERS[id(m)] = self
        self._compile.watch_compile()  # model.compile() from now on is seen
        self._compile.prepare_escape()
        self._compile.after_forward()  # compiled in place already: step 0 runs eagerly
        atexit.register(self.close)

    # ----- public -------------------------------------------------------------------------
    @property
    def steps_logged(self) -> int:
        """Logged steps written to the run so far (also after ``close()``)."""
        return self._writes().written

    def flush(self) -> None:
        """Write the step in progress now (it is otherwise written when the next one starts),
        and return when it is in the run."""
        self._collector.resume()  # a forward stopped by KeyboardInterrupt did not reach its post-hook
        self._finish_step()
        self._writes().wait()

    def close(self) -> None:
        """Write the last step, remove every hook, restore ``inplace`` flags, stop the server."""
        self._collector.resume()
        if self.closed:
            return
        try:
            self._finish_step()
        finally:
            self._release()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.steps_logged} steps logged"
        return f"<torchlens watch of {type(self.model).__name__}: {state}, run_dir={self.run_dir!r}>"

    def _repr_html_(self) -> str:
        """Jupyter shows a watch as its explorer, inline (see ``show``)."""
        from ..serve import notebook_html

        self._writes().wait()  # the steps handed to the writer thread are in the snapshot
        return notebook_html(self.run_dir)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        from ..backends import mimebundle  # live where anywidget is installed, else the snapshot

        self._writes().wait()
        return mimebundle(self)

    def show(self, height: int = 640) -> Any:
        """Show the explorer inline in Jupyter, ``height`` pixels tall: live while the watch is open
        (``torchlens.train.backends.notebook``), else a snapshot of the steps written so far (``notebook_html``).

        Example:
            >>> import tempfile, torch, torchlens as tl
            >>> model = torch.nn.Linear(2, 2)
            >>> with tl.watch(model, run_dir=tempfile.mkdtemp(), backend=None, verbose=False) as w:
            ...     model(torch.ones(1, 2)).sum().backward()
            >>> w.show(height=500)  # doctest: +SKIP
        """
        from ..backends import show

        self._writes().wait()
        return show(self, height)

    def begin_step(self, step: int) -> None:
        """With ``manual_steps=True``: training step ``step`` begins now (every forward pass
        until the next call belongs to it). Calls with the same ``step`` continue that step."""
        if not self.manual_steps:
            raise RuntimeError(
                "begin_step is for tl.watch(..., manual_steps=True); otherwise each training "
                "forward pass of the model is a step."
            )
        if self.closed:
            return
        m = self._machine
        if step != m.step:
            self._start_step(int(step))
        m.model_forwards = 0
        self.recorder.end_forward()
        self._compile.set_logging(m.logging)
        if m.logging:
            self.recorder.begin_forward(include_model=True)

    def step_complete(self) -> bool:
        """Whether the step in progress is a logged one whose backward pass has reached the
        model and none of whose forwards is being recorded: a notebook cell that ran it to its
        end may write it now (``flush``)."""
        m = self._machine
        return m.logging and m.backward_seen and not m.recording

    def attach(self, tensor: torch.Tensor, module: nn.Module, name: str) -> None:
        if self._tracing is not None:
            cid = self._tracing.current(module)
            if cid is not None:
                call = self._tracing.calls[cid]
                if name not in call.attached:
                    call.attached.append(name)
        elif self._machine.recording and isinstance(tensor, torch.Tensor):
            self.recorder.attach(module, name, tensor)

    # ----- what the parts ask -----------------------------------------------------------------
    def _training(self) -> bool:
        return self.model.training and torch.is_grad_enabled()

    def _logging(self) -> bool:
        return self._machine.logging

    def _writes(self) -> StepWriter:
        """The step writer (made once the run folder is)."""
        if self._steps is None:
            raise StepTransitionError("torchlens.train: the watch has no step writer (its outputs failed to open).")
        return self._steps

    # ----- the model's hooks ----------------------------------------------------------------
    def _root_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> Optional[Tuple[tuple, dict]]:
        if torch.compiler.is_compiling():  # the model compiled in place: compiled.py
            return self._compile.inside_graph(self._root_pre, (module, args, kwargs))
        if self._tracing is not None:
            return None  # the metadata pass
        m = self._machine
        if not m.enter_call() and not self._recovered(module):
            return None  # the model calling itself is part of the running pass
        if not self._training():
            return None  # evaluation logs nothing
        start, finished = self._timeline.enter(), m.logged_step()
        try:
            return self._forward_starts(module, args, kwargs)
        finally:
            if m.logging:
                self._timeline.forward_started(m.step, start)  # type: ignore[arg-type]
                self._collector.pause()  # until the post-hook (always called, an error too)
            self._timeline.leave(m.step if m.logging else finished, start)

    def _recovered(self, module: nn.Module) -> bool:
        """Whether a call of the model that looks nested is the first of a new forward: the
        last one was stopped by a ``KeyboardInterrupt`` (a ``BaseException``, for which torch
        skips the always-called post-hook), so no call of the model is running below this one.
        That forward is then ended as its post-hook would have ended it (no output)."""
        if _calls_running(module) > 1:
            return False
        self._machine.depth = 1
        self._root_post(module, (), {}, None)
        return self._machine.enter_call()

    def _forward_starts(self, module: nn.Module, args: tuple, kwargs: dict) -> Optional[Tuple[tuple, dict]]:
        """A training forward of the model begins (not a call of itself)."""
        assert self._sentinel is not None
        self._sentinel.forward_started(args, kwargs)
        m = self._machine
        if self.manual_steps:  # steps begin in begin_step(); the recorder hooks the model too
            # not a call whose forward Lightning swapped for training_step (under DDP): tracing
            # it would run training_step twice (the run then has calls without data-flow edges)
            if m.logging and not self._graph_done and "forward" not in vars(module):
                self._trace_graph(args, kwargs)
            if m.logging and m.model_forwards and not self.recorder.stack:
                # another micro-batch of the step: its calls overlay the first one's (0:1, not 0:2),
                # as when begin_step(n) is called again with the same n (Lightning's accumulation)
                self.recorder.begin_forward(include_model=True)
            m.model_forwards += 1
            return None
        if not m.continues(bool(self._optimizers), self.delay):
            self._start_step(m.next_step, (args, kwargs))
        if not m.logging:
            return None
        self._compile.set_logging(True)
        self.recorder.begin_forward()
        m.apply(StepEvent.FORWARD_STARTED)
        replaced = self.recorder.pre(self.recorder.model, args, kwargs)  # the call's aliases of its inputs
        self._compile.record_hidden(self.recorder.known_calls, self.recorder.record_parameters)
        return replaced

    def _root_post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if torch.compiler.is_compiling():
            return self._compile.inside_graph(self._root_post, (module, args, kwargs, output))
        if self._tracing is not None:
            return
        if not self._machine.leave_call():
            return
        start = self._timeline.enter()
        try:
            self._forward_ends(args, kwargs, output)
        finally:
            self._collector.resume()
            m = self._machine
            self._timeline.leave(m.step if m.logging and self._training() else None, start)
            self._timeline.forward_ended()

    def _forward_ends(self, args: tuple, kwargs: dict, output: Any) -> None:
        if not self.manual_steps:
            self._compile.after_forward()
        m = self._machine
        if m.recording:
            m.apply(StepEvent.FORWARD_ENDED)
            try:
                self.recorder.post(self.recorder.model, args, kwargs, output)
            finally:
                self.recorder.end_forward()
            if self._steps is not None:
                self._steps.measure_ahead()  # on the writer thread, during the backward pass
                if self._updates is not None and m.logging and m.step is not None:
                    self._updates.prefetch(m.step, self._steps.run_soon)  # the next copies, meanwhile
        if m.step is not None and (m.logging or self.delay) and self._training():
            self._mark_backward(output)
        assert self._sentinel is not None
        self._sentinel.forward_ended(output)

    def _mark_backward(self, output: Any) -> None:
        """Hooks on the model's outputs, where a backward pass enters the model: they tell a
        step with several forwards that its backward has come, and start waiting for its end."""
        from ..model import output_tensors

        for _, t in output_tensors(output):
            if t.requires_grad:
                try:
                    self._machine.add_marker(t.register_hook(self._output_gradient))
                except RuntimeError:  # a view that autograd refuses hooks on: the other hooks still work
                    pass

    # ----- the step's backward and optimizer step -------------------------------------------
    def _output_gradient(self, grad: torch.Tensor) -> None:
        self._machine.backward_seen = True
        self._gradient_arrived()

    def _gradient_arrived(self) -> None:
        """Called by every gradient hook of a logged step: the first one of a backward pass asks
        the autograd engine for a call when the pass has ended."""
        m = self._machine
        if m.logging and not m.awaiting_backward:
            m.apply(StepEvent.BACKWARD_STARTED)
            self._timeline.backward_started(m.step)  # type: ignore[arg-type]
            _ENGINE.queue_callback(functools.partial(self._backward_ending, m.step))

    def _backward_ending(self, step: int) -> None:
        # callbacks queued during the pass run before this one; one queued now runs after them
        # all, among them DistributedDataParallel's, which writes the averaged gradients to .grad
        _ENGINE.queue_callback(functools.partial(self._backward_ended, step))

    def _backward_ended(self, step: int) -> None:
        m = self._machine
        if step != m.step or not m.logging:
            return
        m.apply(StepEvent.BACKWARD_ENDED)
        start = self._timeline.enter()
        self._timeline.backward_ended(step, start)
        try:
            # .grad as the backward pass left it; a later backward through the same forward (two
            # losses, retain_graph=True) reads it again, so the step keeps the accumulated value.
            # The step is written now (readable at once) and again if a later backward adds to it.
            self.recorder.collect_param_grads()
            self._writes().update(step)
        finally:
            self._timeline.leave(step, start)

    def _optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._machine.stepped = self._machine.step is not None
        self._make_durable()

    def _any_optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._make_durable()

    def _optimizer_pre(self, outer: bool, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._timeline.optimizer_pre(self._machine.logged_step(), outer)
        if outer and self._machine.logging:
            self.recorder.settle()  # the parameters read where they lie, before the step changes them

    def _make_durable(self) -> None:
        """A logged step's optimizer step has ended: its writes are committed before training
        goes on, so a process killed from now on (``kill -9``) keeps the step in its run
        (unless ``durable=False``: see ``StepWriter.durable``)."""
        start = _now()
        if self._machine.logging and self._writer is not None and not self.closed:
            self._writes().durable()
        self._timeline.optimizer_ended(start)

    # ----- a step begins and ends ------------------------------------------------------------
    def _start_step(self, step: int, call: Optional[tuple] = None) -> None:
        self._finish_step()
        m = self._machine
        m.begin(step, ready=self._compile.ready())
        assert self._sentinel is not None
        self._sentinel.step_started(step)
        if not m.logging:  # kept from a logged step before: a step not logged runs without them
            self.recorder.remove_forward_hooks()
            self.recorder.remove_param_hooks()
            return
        # lazy modules get their parameters in the traced pass (hooks after it); FSDP swaps the
        # parameters in it (hooks before it, on the sharded ones that receive the gradients)
        sharded = self._ranks is not None and bool(self._ranks.sharded)
        if sharded:
            self.recorder.begin_step(step)
        if not self._graph_done and call is not None:
            self._trace_graph(*call)
        if not sharded:
            self.recorder.begin_step(step)

    def _finish_step(self) -> None:
        self._timeline.flush_hooks()  # the step's hooks' sum goes with its next write
        step, logged = self._machine.finish()
        if step is None or not logged or self._writer is None:
            return
        self._writes().finish(step, self.recorder.end_step())

    def _trace_graph(self, args: tuple, kwargs: dict) -> None:
        self._graph_done = True
        calls = None
        try:
            with self._compile.eager_pass():  # Dynamo must not compile the traced pass
                calls = trace_calls(self.recorder.model, args, kwargs, on_attach=self._set_tracing)
        except Exception as error:  # the histograms do not depend on the graph: keep training
            warnings.warn(
                f"torchlens.train: tracing the module graph of {type(self.model).__name__} failed "
                f"({type(error).__name__}: {error}); histograms are recorded, the graph will lack "
                "data-flow edges.",
                RuntimeWarning,
                stacklevel=3,
            )
        if calls:
            if self._writer is not None:
                self._writes().wait()  # one connection: the writer thread's transactions come first
                self._writer.add_calls(calls.values())
            self.recorder.known_calls.update(calls)

    def _set_tracing(self, recorder: Any) -> None:
        self._tracing = recorder

    # ----- releasing ----------------------------------------------------------------------------
    def _release(self) -> None:
        self.closed = True
        for h in self._root_hooks:
            h.remove()
        self._root_hooks = []
        self._machine.remove_markers()
        if self._updates is not None:
            self._updates.remove()
        if self._sentinel is not None:
            self._sentinel.close()
        self._compile.close()
        self._compile.unwatch_compile()
        self._machine.depth = 0
        self.recorder.remove_forward_hooks()
        self.recorder.remove_param_hooks()
        self.recorder.end_step()
        for m in self._inplace_flags:
            m.inplace = True
        self._inplace_flags = []
        if _WATCHES.get(id(self.model)) is self:
            del _WATCHES[id(self.model)]
        for key in [k for k, w in _MODULE_OWNERS.items() if w is self]:
            del _MODULE_OWNERS[key]
        if self._server is not None:
            self._server.close()
            self._server = None
        self._close_backends()
        self._close_run()
        atexit.unregister(self.close)

    def _close_backends(self) -> None:
        for backend in self.backends:
            try:
                backend.close(self.run_dir)
            except Exception as error:  # a backend's own failure must not keep hooks on the model
                warnings.warn(
                    f"torchlens.train: closing the {backend.name} backend failed: {error}", RuntimeWarning, stacklevel=4
                )
        self.backends.clear()  # the step writer's list too

    def _close_run(self) -> None:
        failed = True
        try:
            if self._steps is not None:
                self._steps.close()  # the writes under way end first
                failed = self._steps.failed
        finally:
            if self._writer is not None:
                try:  # the timeline rows no write took (the last optimizer step's)
                    self._writer.write_timeline(self._timeline.take())
                except sqlite3.Error:  # a full disk: the histograms are what matters
                    pass
                self._writer.close("failed" if failed else "finished")  # a run missing steps is not finished
                self._writer = None
            self.recorder.copies.clear()  # the host memory of the copies awaiting measurement


def watch(
    model: nn.Module,
    log_freq: int = 1,
    log: Iterable[str] = DEFAULT_KINDS,
    backend: Union[str, Iterable[str], None] = "standalone",
    run_dir: Optional[str] = None,
    port: int = 8080,
    sample_n: Optional[int] = 100,
    reject_outlier_proportion: float = 0.1,
    disable_inplace: bool = False,
    ignore_io_grad_classes: Iterable[type] = (),
    delay_log_multibackward: bool = False,
    host: str = "127.0.0.1",
    max_columns: int = 512,
    verbose: bool = True,
    tensorboard_writer: Any = None,
    wandb_html_every: int = 50,
    manual_steps: bool = False,
    input_grads: bool = False,
    on_nonfinite: Optional[str] = None,
    optimizer: Any = None,
    durable: bool = True,
) -> Watch:
    """Record histograms of every module call's inputs, outputs, their gradients and the
    parameters while ``model`` trains; read them with ``tl.open_run(w.run_dir)``.

    Args:
        model: the ``nn.Module`` to watch (a ``DistributedDataParallel`` wrapper is unwrapped).
            Under ``torch.distributed`` call ``watch`` on every rank: each logged step's series
            are those of the global batch, rank 0 writes the run (``w.run_dir`` is None on the
            others); every rank must call ``close()``.
        log_freq: log every ``log_freq``-th training step, the first one included. A step is a
            forward pass in training mode with gradients enabled; when ``optimizer`` is given, an
            optimizer step: the forward passes before each ``optimizer.step()`` (gradient
            accumulation, two forwards per update) are one step, their calls overlaid (the
            ``count`` of ``0:1`` is that of all its micro-batches). A logged step is written to
            the run when its backward pass ends (readable at once), and again when a later
            backward pass through its forward or its optimizer step adds to it; a step without
            backward when the next starts (or at ``flush()``/``close()``). ``params_grad`` is
            ``.grad`` after the last backward pass.
        log: any of ``'io'``, ``'io_grad'``, ``'params'``, ``'params_grad'``, ``'updates'``.
            ``io_grad`` of an input is the gradient this call sends back into it (not the
            input's total gradient, which also holds what its other consumers, e.g. a skip, send
            back); of an output, the gradient that arrives at it. ``updates`` (not in the
            default): each parameter's change across ``optimizer.step()``, with the ratio
            ``||dw|| / ||w||`` as its line (``torchlens.train.record.updates``). A series without
            values says why (``Series.reason``).
        backend: one name or several: ``'standalone'`` serves the explorer page at
            ``http://localhost:port`` from a process of its own (page loads cost training
            nothing; it ends with the watch or the training process); ``'wandb'`` logs into
            the active wandb run (histograms under ``torchlens/<call id>/<kind>/<name>`` and
            the page as ``torchlens/explorer``); ``'tensorboard'`` writes the same histograms
            as TensorBoard events. The run database is always written; ``None`` or ``()``
            writes only it.
        run_dir: the run folder (default: a new folder under ``./torchlens_runs/``).
        port, host: where the standalone server listens (``port=0``: any free port). It
            answers only requests to that address; off loopback they need the token that
            ``w.url`` (printed) carries.
        sample_n: values sampled per tensor (``None``: all).
        reject_outlier_proportion: fraction of values farthest from the median dropped.
        disable_inplace: turn off ``inplace`` flags of modules while watched.
        ignore_io_grad_classes: module classes whose input/output gradients are not recorded.
        delay_log_multibackward: several forward passes before one backward form one step.
        max_columns: columns kept per series; older ones are merged beyond that.
        verbose: print the run folder and the URL once.
        tensorboard_writer: a ``SummaryWriter`` to log into (default: one on ``run_dir``).
        wandb_html_every: refresh the page in wandb every this many logged steps.
        manual_steps: steps begin when you call ``w.begin_step(n)`` (for frameworks whose
            training step does not call the model itself, or to count optimizer steps), with all
            their forward and backward passes: the model's forwards of one step (micro-batches)
            are overlaid into its calls, as the Lightning callback does; otherwise each
            training forward pass of the model is a step.
        input_grads: also record the gradient of the model's own floating inputs (the data)
            when they do not require grad: on logged steps the model gets an alias of each that
            requires grad (your tensor keeps ``requires_grad=False``). Off by default: it adds
            work training never does (the first layers' input gradients, some 8% of a CPU
            ResNet-18 step). Inputs that require grad get their strips either way.
        optimizer: the optimizer(s) whose steps make ``updates`` (default: every optimizer
            whose step changes a watched parameter, found by torch's global step hooks). Given,
            they also delimit the steps: a step is everything up to an optimizer step.
        on_nonfinite: ``None``, ``'warn'``, ``'raise'`` or ``'trace'``: check every step for NaN/Inf
            in the outputs and gradients (``torchlens.train.health.sentinel``); warn once naming the step
            and call, raise ``tl.NonfiniteError`` from ``backward()``, or also name the operation.
        durable: a logged step is in the run before its optimizer step returns, so a process
            killed afterwards (``kill -9``) keeps every finished step (the default). False: the
            step is written while training goes on, and a killed process may lose the last
            logged step or two; a logged step then costs less, most on a GPU, where that wait
            also waits for the step's kernels. ``flush()`` and ``close()`` wait in both cases,
            and so does the end of each logged step with a ``wandb`` or ``tensorboard`` backend
            (they are given the step's histograms then).

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        >>> w = tl.watch(model, run_dir=tempfile.mkdtemp(), backend=None, verbose=False)
        >>> for _ in range(5):
        ...     model(torch.rand(8, 3)).mean().backward()
        >>> w.close()
        >>> run = tl.open_run(w.run_dir)
        >>> len(run.steps), sorted(run.calls)
        (5, ['', '0:1', '1:1', '2:1'])
    """
    active_group(model)  # a DistributedDataParallel model without a process group is an error
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    require_instance("model", model, "tl.watch", nn.Module, takes="a torch.nn.Module")
    options = WatchOptions(  # every option checked, before anything is made or served: options.py
        log_freq=log_freq,
        log=log,
        backend=backend,
        run_dir=run_dir,
        port=port,
        sample_n=sample_n,
        reject_outlier_proportion=reject_outlier_proportion,
        disable_inplace=disable_inplace,
        ignore_io_grad_classes=ignore_io_grad_classes,
        delay_log_multibackward=delay_log_multibackward,
        host=host,
        max_columns=max_columns,
        verbose=verbose,
        tensorboard_writer=tensorboard_writer,
        wandb_html_every=wandb_html_every,
        manual_steps=manual_steps,
        input_grads=input_grads,
        on_nonfinite=on_nonfinite,
        optimizer=optimizer,
        durable=durable,
    )
    _refuse_watched(model)
    return Watch(model, options)


def _refuse_watched(model: nn.Module) -> None:
    """A model (or one of its modules) is watched once at a time."""
    if id(model) in _WATCHES:
        raise RuntimeError(
            f"tl.watch: this {type(model).__name__} is already watched (run {_WATCHES[id(model)].run_dir}). "
            "Close that watch first (w.close() or tl.unwatch(model))."
        )
    if any(id(m) in _MODULE_OWNERS for m in model.modules()):
        raise RuntimeError(
            "tl.watch: a module of this model is already watched as part of another model. Close that watch first."
        )


def unwatch(model: nn.Module) -> None:
    """Stop watching ``model`` (the same as closing the object ``tl.watch`` returned)."""
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    require_instance("model", model, "tl.unwatch", nn.Module, takes="a torch.nn.Module")
    w = _WATCHES.get(id(model))
    if w is None:
        raise ArgumentValueError(f"tl.unwatch: this {type(model).__name__} (model) is not being watched.")
    w.close()


def attach(tensor: torch.Tensor, module: nn.Module, name: str) -> torch.Tensor:
    """Inside a module's ``forward``, log ``tensor`` under ``name`` as if it were one more output
    of that call. Returns ``tensor`` unchanged; does nothing when the model is not watched.

    Example:
        >>> import torch, torchlens as tl
        >>> class Net(torch.nn.Module):
        ...     def forward(self, x):
        ...         h = tl.attach(x * 2, self, "doubled")
        ...         return h + 1
        >>> Net()(torch.ones(2)).tolist()
        [3.0, 3.0]
    """
    require_instance("module", module, "tl.attach", nn.Module, takes="the module whose forward calls attach (self)")
    require_instance("tensor", tensor, "tl.attach", torch.Tensor, takes="a tensor")
    require_str("name", name, "tl.attach")
    w = _MODULE_OWNERS.get(id(module))
    if w is not None:
        w.attach(tensor, module, str(name))
    return tensor


__all__ = ["watch", "unwatch", "attach", "Watch", "WatchOptions"]
