"""``tl.watch`` on compiled models: ``torch.compile(model)``, ``model.compile()`` and compiled
submodules.

Dynamo does not guard on module hooks: hooks added after a module was compiled are silently
skipped by its compiled code, and hooks present while it compiles are traced into the graph
(where torchlens's Python cannot run). So a watch never lets Dynamo see its hooks:

* a logged step's forward runs with ``torch.compiler.set_stance("force_eager")``: the compiled
  parts run their Python code, every hook fires, the series are those of the eager model, and
  nothing is compiled or recompiled for it (a logged step costs an eager step plus the hooks);
* unlogged steps run the user's compiled code untouched (the watch's only hooks then sit on the
  model object outside the compiled region, or, for ``model.compile()`` of the watched model
  itself, are called across one graph break each: Dynamo calls them as plain Python);
* parts compiled with ``fullgraph=True`` keep running compiled on logged steps too (switching
  them to eager would not be the program the user asked for): what needs no hook inside the graph
  is recorded (``params`` and ``params_grad`` of their modules, the io of the model's own call
  when the wrapper is outside the graph); their modules' io and io_grad are not, with one warning.

Modules are addressed as an eager model addresses them: a compiled submodule ``sub`` is the
module it wraps (``sub.0``, not ``sub._orig_mod.0``), so call ids equal those of the eager model.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn

FULLGRAPH_REASON = (
    "not recorded: the module runs inside a torch.compile(fullgraph=True) graph, where torchlens's "
    "hooks cannot run without breaking the graph"
)


def is_optimized(module: nn.Module) -> bool:
    """``torch.compile(module)``'s wrapper (an ``OptimizedModule`` holding ``_orig_mod``)."""
    return "_orig_mod" in module._modules and any(c.__name__ == "OptimizedModule" for c in type(module).__mro__)


def unwrap(model: nn.Module) -> nn.Module:
    """The module a ``torch.compile`` wrapper holds (the model itself otherwise)."""
    while is_optimized(model):
        model = model._modules["_orig_mod"]  # type: ignore[assignment]
    return model


def named_modules(model: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """``named_modules`` with compile wrappers left out: a wrapper's module at the wrapper's
    address, as in the eager model.

    Example:
        >>> import torch
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> [a for a, _ in named_modules(m)]
        ['', '0']
    """
    seen: Set[int] = set()
    stack = [("", model)]
    while stack:
        address, module = stack.pop()
        module = unwrap(module)
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield address, module
        prefix = address + "." if address else ""
        stack.extend(reversed([(prefix + n, m) for n, m in module._modules.items() if m is not None]))


def _fullgraph_of(compiled: Any) -> bool:
    """Whether a compile wrapper (an ``OptimizedModule`` or ``module._compiled_call_impl``) was
    made with ``fullgraph=True`` (read from its Dynamo context; False when it cannot be told)."""
    ctx = getattr(compiled, "dynamo_ctx", None)
    if ctx is None:
        for cell in getattr(compiled, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if hasattr(value, "fullgraph"):
                ctx = value
                break
    return bool(getattr(ctx, "fullgraph", False) or getattr(ctx, "error_on_graph_break", False))


def compiled_parts(model: nn.Module) -> List[Tuple[str, nn.Module, bool]]:
    """``(address, module, fullgraph)`` of each compiled part of ``model`` (itself included):
    wrapped by ``torch.compile`` or compiled in place with ``module.compile()``."""
    if "torch._dynamo" not in sys.modules:  # nothing can have been compiled
        return []
    parts = []
    stack: List[Tuple[str, nn.Module]] = [("", model)]
    while stack:
        address, module = stack.pop()
        while is_optimized(module):
            parts.append((address, module._modules["_orig_mod"], _fullgraph_of(module)))
            module = module._modules["_orig_mod"]  # type: ignore[assignment]
        impl = getattr(module, "_compiled_call_impl", None)
        if impl is not None:
            parts.append((address, module, _fullgraph_of(impl)))
        prefix = address + "." if address else ""
        stack.extend((prefix + n, m) for n, m in module._modules.items() if m is not None)
    return parts


def hookable_modules(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``named_modules`` (compile wrappers left out) without the modules that no hook may reach:
    with any ``fullgraph=True`` part, those inside a compiled part (``CompileSwitch.hidden``).

    Example:
        >>> import torch
        >>> [a for a, _ in hookable_modules(torch.nn.Sequential(torch.nn.Tanh()))]
        ['', '0']
    """
    switch = CompileSwitch(model, warn=False)
    return [(a, m) for a, m in named_modules(model) if id(m) not in switch.hidden]


class CompileSwitch:
    """Keeps a watch's hooks out of Dynamo's sight (see the module's docstring).

    ``outer`` is the model the user calls (maybe a ``torch.compile`` wrapper); the recorder
    addresses the module it wraps (``inner``). ``on_hidden(modules, root_graph)`` is told, at
    each look for compiled parts, the ids of the modules no hook may reach and whether the
    model's own call is one fullgraph graph; ``next_logged()`` says whether the next forward is
    a logged step's (the watched model compiled in place decides eager or compiled before it
    runs)."""

    def __init__(
        self,
        outer: nn.Module,
        on_hidden: Optional[Callable[[Set[int], bool], None]] = None,
        next_logged: Callable[[], bool] = lambda: False,
        warn: bool = True,
    ) -> None:
        self.outer, self.inner = outer, unwrap(outer)
        self.on_hidden = on_hidden
        self.next_logged = next_logged
        self.eager = False  # force_eager is on, set by this switch
        self._prior: Optional[str] = None
        self.hidden: Set[int] = set()  # ids of modules inside compiled parts that must not be hooked
        self.fullgraph = False
        self.hidden_addresses: List[str] = []
        self.root_in_place = False  # the watched model itself compiled with .compile()
        self.root_fullgraph = False
        self.has_parts = False
        self._warned = not warn
        self._escape: Optional[Callable] = None
        self._compile_attr = False
        self.refresh()

    def refresh(self) -> None:
        """Look for compiled parts again (a submodule may have been compiled since)."""
        parts = compiled_parts(self.outer)
        self.has_parts = bool(parts)
        self.fullgraph = any(fullgraph for _, _, fullgraph in parts)
        self.root_in_place = getattr(self.inner, "_compiled_call_impl", None) is not None
        self.root_fullgraph = self.root_in_place and _fullgraph_of(self.inner._compiled_call_impl)
        self.hidden.clear()
        hidden_addresses: Dict[str, None] = {}
        # one global switch: with any fullgraph part, no part is switched to eager, so no module
        # inside any compiled part may carry a hook (the model's own call stays recorded when
        # its wrapper is outside the graph)
        for address, module, _ in parts if self.fullgraph else ():
            for sub_address, sub in named_modules(module):
                if sub is not self.inner or self.root_in_place:
                    self.hidden.add(id(sub))
                    hidden_addresses[_join(address, sub_address)] = None
        self.hidden_addresses = list(hidden_addresses)
        if self.on_hidden is not None:
            self.on_hidden(self.hidden, any(address == "" and fullgraph for address, _, fullgraph in parts))
        if self.hidden and not self._warned:
            self._warned = True
            if self.root_fullgraph:
                warnings.warn(
                    "torchlens.watch: the watched model itself is compiled with fullgraph=True (model.compile): "
                    "its hooks cannot run inside the graph, so no step is seen and nothing is recorded. Watch "
                    "torch.compile(model, fullgraph=True) instead (params and params_grad are then recorded), "
                    "or compile without fullgraph=True (everything is recorded; logged steps run eagerly).",
                    RuntimeWarning,
                    stacklevel=4,
                )
                return
            shown = ", ".join(repr(a) for a in self.hidden_addresses[:5])
            more = f" and {len(self.hidden_addresses) - 5} more" if len(self.hidden_addresses) > 5 else ""
            warnings.warn(
                f"torchlens.watch: modules {shown}{more} run inside a torch.compile(fullgraph=True) graph; "
                "their io and io_grad are not recorded (a hook inside the graph would break it), their "
                "params and params_grad are. Compile with fullgraph=False to record everything: logged "
                "steps then run eagerly.",
                RuntimeWarning,
                stacklevel=4,
            )

    # ----- around forward passes ------------------------------------------------------------
    def ready(self) -> bool:
        """False while a forward runs compiled code that the hooks must stay out of: the watched
        model compiled in place, entered before the switch could be set."""
        return not (self.root_in_place and not self.fullgraph and not self.eager)

    def set_logging(self, logged: bool) -> None:
        """A step's forward begins (or, with manual steps, a step): a logged one runs compiled
        parts eagerly, unless a part is fullgraph."""
        if logged:
            self.refresh()
        want = logged and self.has_parts and not self.fullgraph
        if want != self.eager:
            self._set_eager(want)

    def after_forward(self) -> None:
        """A forward ended. The watched model compiled in place decides eager or compiled when it
        is entered, before any hook runs: the switch is set now for the next forward."""
        want = self.root_in_place and not self.fullgraph and self.next_logged()
        if want != self.eager:
            self._set_eager(want)

    @contextlib.contextmanager
    def eager_pass(self) -> Iterator[None]:
        """Compiled code runs its Python code meanwhile (the graph's metadata pass)."""
        if "torch._dynamo" not in sys.modules or self.eager:
            yield
            return
        self._set_eager(True)
        try:
            with warnings.catch_warnings():  # torch's note on the tracer's global hooks and compiled wrappers
                warnings.filterwarnings(
                    "ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks"
                )
                yield
        finally:
            self._set_eager(False)

    def record_hidden(self, known_calls: Iterable[str], record: Callable[[nn.Module], None]) -> None:
        """The parameters of modules no hook may reach, once per call of theirs in the traced
        graph (``known_calls``: its call ids; ``record(module)`` records one call of ``module``
        with its parameters alone, whose ``params_grad`` follows); called while the model's own
        call is recorded."""
        if not self.hidden:
            return
        calls: Dict[str, int] = {}
        for cid in known_calls:
            address = cid.rpartition(":")[0]
            calls[address] = calls.get(address, 0) + 1
        for address, module in named_modules(self.inner):
            if id(module) in self.hidden and module is not self.inner:
                for _ in range(max(calls.get(address, 0), 1)):
                    record(module)

    def close(self) -> None:
        if self.eager:
            self._set_eager(False)

    def _set_eager(self, on: bool) -> None:
        from torch._dynamo import eval_frame

        if on:
            self._prior = eval_frame._stance.stance
            torch.compiler.set_stance("force_eager")
        else:
            torch.compiler.set_stance(self._prior or "default")  # type: ignore[arg-type]
        self.eager = on

    # ----- the watched model compiled in place --------------------------------------------
    def inside_graph(self, hook: Callable, args: tuple) -> Any:
        """A root hook reached while Dynamo traces the watched model: run it across a graph break
        (Dynamo calls a disabled function as plain Python), or not at all in a fullgraph."""
        if self._escape is None or self.fullgraph:
            return None
        return self._escape(hook, args)

    def prepare_escape(self) -> None:
        if self._escape is None and "torch._dynamo" in sys.modules:
            self._escape = torch.compiler.disable(_call, recursive=True)

    def watch_compile(self) -> None:
        """Learn of ``model.compile()`` called on the watched model while it is watched: the
        instance's ``compile`` (``_CompileSpy``) runs ``nn.Module.compile``, then sets the switch."""
        if "compile" in vars(self.inner):
            return
        object.__setattr__(self.inner, "compile", _CompileSpy(self.inner, self))
        self._compile_attr = True

    def compiled(self) -> None:
        """The watched model was just compiled in place."""
        self.prepare_escape()
        self.refresh()
        self.after_forward()

    def unwatch_compile(self) -> None:
        if self._compile_attr:
            self._compile_attr = False
            vars(self.inner).pop("compile", None)


class _CompileSpy:
    """``model.compile`` while the model is watched. A copy of the model (``copy.deepcopy``,
    pickle) gets one that only compiles: copies are not watched."""

    __slots__ = ("module", "switch")

    def __init__(self, module: nn.Module, switch: Optional[CompileSwitch] = None) -> None:
        self.module, self.switch = module, switch

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        nn.Module.compile(self.module, *args, **kwargs)
        if self.switch is not None:
            self.switch.compiled()

    def __deepcopy__(self, memo: dict) -> "_CompileSpy":
        return _CompileSpy(memo.get(id(self.module), self.module))  # the copy of the model

    def __reduce__(self) -> tuple:
        return (_CompileSpy, (self.module,))


def _call(hook: Callable, args: tuple) -> Any:
    return hook(*args)


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a and b else a or b


def dynamo_counts() -> Dict[str, int]:
    """Dynamo's counters so far: graphs compiled, graph breaks, frames it compiled (a recompile
    is one more frame compiled for the same code) ; zeros when Dynamo is not loaded.

    Example:
        >>> sorted(dynamo_counts())
        ['frames', 'graph_breaks', 'graphs']
    """
    if "torch._dynamo" not in sys.modules:
        return {"graphs": 0, "graph_breaks": 0, "frames": 0}
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "frames": int(counters["frames"]["ok"]),
    }


__all__ = ["CompileSwitch", "compiled_parts", "named_modules", "unwrap", "is_optimized", "dynamo_counts"]
