"""``ModelHistory``: every operation of one forward pass, indexable and printable."""

from __future__ import annotations

import difflib
import operator
import weakref
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    SupportsIndex,
    Tuple,
    Union,
    overload,
)

import torch
from torch import nn

from ...arguments import require_bool, require_instance, require_int, require_path, require_str
from ..records.tensor_log import TensorLogEntry
from ..records.visible_text import visible
from .extensions import extension
from .index import Ambiguous, Found, Key, build_lookup, keep_keys
from .module_info import ModuleInfo, PassStats
from .pickling import dumps_history, loads_history
from .rolled import RolledLayer, roll
from .summary import layers_text, summary_text

# A new value for a layer in ``rerun``: a tensor, or ``fn(activation, entry)`` returning one.
Change = Union[torch.Tensor, Callable[[torch.Tensor, TensorLogEntry], torch.Tensor]]

if TYPE_CHECKING:
    import pandas


class ModelHistory:
    """The log of one forward pass: one ``TensorLogEntry`` per tensor, in execution order.

    Index with a layer label (``'conv2d_3_7'``, ``'conv2d_3'``, ``'linear_1_1:2'``), a module
    address (``'features.6'``, ``'features.6:1'``), an input/output address, or an ordinal
    (``7``, ``-17``).

    Example:
        >>> import torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> h = tl.log_forward_pass(model, torch.ones(2, 3))
        >>> h.layer_labels
        ['input_1_0', 'linear_1_1', 'relu_1_2', 'output_1_3']
        >>> h[1].label, h[-1].label
        ('linear_1_1', 'output_1_3')
    """

    # Built by a trace in this process, not read from a folder: its saved functions and arguments
    # are the model's own, so its replays (validation, rerun, patching) run without the guard that
    # bounds a loaded history's (replay_guard.py). Never saved: a loaded history is always guarded.
    traced_here: bool = False

    def __init__(
        self,
        model_name: str,
        entries: List[TensorLogEntry],
        lookup: Optional[Dict[Key, Found]],
        all_labels: List[str],
        modules: ModuleInfo,
        param_info: Dict[str, Tuple[torch.Size, int, int]],
        random_seed: int,
        pass_time: float,
        postprocess_time: float,
    ) -> None:
        self.model_name = model_name
        self.layer_list: List[TensorLogEntry] = entries
        self._index: Optional[Dict[Key, Found]] = lookup
        self._all_labels = all_labels
        self.modules = modules
        if lookup is None:
            self._own(entries)
        self.param_info = param_info
        self.random_seed = random_seed
        self.pass_time = pass_time
        self.postprocess_time = postprocess_time
        self._rolled: Optional[Dict[str, RolledLayer]] = None
        self.pass_stats = PassStats.of(entries)  # the whole pass, even if entries are dropped later
        self.notes: List[str] = []  # what the user should know about this trace (printed in the summary)

    # ----- what post-processing, loading and rerun use to build or change a history ---------
    def replace_entries(self, entries: List[TensorLogEntry], lookup: Optional[Dict[Key, Found]] = None) -> None:
        """Make ``entries`` this history's layers, found by the keys of ``lookup`` (None: of an
        index built on first use)."""
        self.layer_list = entries
        self._index = lookup
        self._rolled = None
        if lookup is None:
            self._own(entries)

    def _own(self, entries: List[TensorLogEntry]) -> None:
        """Each entry's module passes (for printing) and its way to this history's index, whose
        building gives it its ``lookup_keys`` (a weak one: the history holds its entries)."""
        passes, history = self.modules.passes, weakref.ref(self)
        for e in entries:
            e.module_passes = passes
            e._history = history

    @property
    def _lookup(self) -> Dict[Key, Found]:
        """Every key -> what it names. Built on first use: a pass whose layers are never looked
        up by key (a history iterated, summarised, or dropped) never pays for it."""
        index = self._index
        if index is None:
            index = self._index = build_lookup(self.layer_list, self.modules.passes)
        return index

    def __del__(self) -> None:
        """Entries that outlive a history whose index was never built (a loop over a history
        nothing else holds, a slice kept) get their ``lookup_keys`` now, while their history's
        other entries are at hand; nothing to do for the others (see ``index.keep_keys``)."""
        state = self.__dict__
        if state.get("_index") is None and "layer_list" in state and "modules" in state:
            keep_keys(state, "layer_list", self.modules.passes)

    def lookup_value(self, key: Key) -> Optional[Found]:
        """What a key names: an entry, an ambiguity (several layers), or None."""
        return self._lookup.get(key)

    def lookup_keys(self) -> List[str]:
        """Every string key of this history (labels, module addresses, input/output addresses)."""
        return [k for k in self._lookup if isinstance(k, str)]

    def attach_store(self, store: object) -> None:
        """The open tensor files a loaded history reads its tensors from (kept alive with it)."""
        self._store = store

    # ----- pickling and copying (see pickling.py) -------------------------------------------
    def __reduce_ex__(self, protocol: SupportsIndex) -> Tuple[Callable[[bytes], object], Tuple[bytes]]:
        """Pickle (and ``copy.deepcopy``) through ``pickling.dumps_history``: the call frames' code
        objects become picklable stand-ins that keep their source text."""
        return loads_history, (dumps_history(self),)

    def __copy__(self) -> "ModelHistory":
        """A shallow copy: a new history object sharing the entries."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    # ----- container protocol ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.layer_list)

    def __iter__(self) -> Iterator[TensorLogEntry]:
        return iter(self.layer_list)

    def __contains__(self, key: object) -> bool:
        try:
            return as_key(key) in self._lookup
        except TypeError:
            return False

    @overload
    def __getitem__(self, key: slice) -> List[TensorLogEntry]: ...

    @overload
    def __getitem__(self, key: Union[str, int]) -> TensorLogEntry: ...

    def __getitem__(self, key: Union[str, int, slice]) -> Union[TensorLogEntry, List[TensorLogEntry]]:
        """An entry by key (see the class docstring); a slice gives a list of entries in order
        (``history[2:5]``); any integer type works as a position (``history[np.int64(3)]``)."""
        if isinstance(key, slice):
            return self.layer_list[key]
        key = as_key(key)
        found = self._lookup.get(key)
        if isinstance(found, TensorLogEntry):
            return found
        if isinstance(found, Ambiguous):
            shown = ", ".join(repr(k) for k in found.suggestions[:6]) + (", ..." if len(found.suggestions) > 6 else "")
            raise KeyError(
                f"{key!r} names several layers ({found.what}): {', '.join(found.labels)}. "
                f"Pick one with a key that names it alone: {shown}."
            )
        raise KeyError(self._unknown_key_message(key))

    def _unknown_key_message(self, key: Union[str, int]) -> str:
        if isinstance(key, int):
            return f"Layer {key} is out of range: this history has {len(self)} layers (use 0..{len(self) - 1} or -1..-{len(self)})."
        base = key.rpartition(":")[0] if ":" in key else key
        missing_pass = self._missing_pass_message(key)
        if missing_pass is not None:
            return missing_pass
        if key in self._all_labels or base in self.modules.passes:
            what = "Layer" if key in self._all_labels else "The output of module"
            return (
                f"{what} {key!r} ran but was not kept because its activation was not saved; "
                "pass keep_unsaved_layers=True (or include it in layers_to_save) to keep it."
            )
        if key in self.modules.types and key not in self.modules.passes:
            return f"Module {key!r} was not called in this forward pass."
        candidates = [k for k in self._lookup if isinstance(k, str)]
        close = difflib.get_close_matches(key, candidates, n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        return f"{key!r} is not a layer label, module address or input/output address of this history.{hint}"

    def _missing_pass_message(self, key: str) -> Optional[str]:
        """``'fc:2'`` for a module (or layer) that ran once: say how many passes it has."""
        base, _, suffix = key.rpartition(":")
        if not suffix.isdigit():
            return None
        passes, what = self.modules.passes.get(base), "Module"
        if passes is None:
            passes, what = self._layer_passes(base), "Layer"
        if passes is None or 1 <= int(suffix) <= passes:
            return None
        if passes == 1:
            return (
                f"{what} {base!r} has 1 pass in this forward pass (it ran once), so {key!r} names nothing: "
                f"use {base!r} or '{base}:1'."
            )
        return (
            f"{what} {base!r} has {passes} passes in this forward pass, so {key!r} names nothing: "
            f"use '{base}:1' to '{base}:{passes}'."
        )

    def _layer_passes(self, name: str) -> Optional[int]:
        """How many passes the layer ``name`` (``'linear_1_1'`` or ``'linear_1'``) has, if it is one."""
        for e in self.layer_list:
            if name in (e.layer_label, e.short_label):
                return e.num_passes
        passes = sum(1 for label in self._all_labels if label == name or label.rpartition(":")[0] == name)
        return passes or None  # a layer whose entries were all dropped (layers_to_save)

    # ----- views ----------------------------------------------------------------------------
    @property
    def layer_labels(self) -> List[str]:
        return [e.label for e in self.layer_list]

    @property
    def input_layers(self) -> List[str]:
        return [e.label for e in self.layer_list if e.is_input]

    @property
    def output_layers(self) -> List[str]:
        return [e.label for e in self.layer_list if e.is_output]

    @property
    def buffer_layers(self) -> List[str]:
        return [e.label for e in self.layer_list if e.is_buffer]

    @property
    def untraced_layers(self) -> List[str]:
        """Tensors made by calls torchlens does not trace (gaps in the graph; see the README)."""
        return [e.label for e in self.layer_list if e.kind == "untraced"]

    @property
    def internally_created_layers(self) -> List[str]:
        return [e.label for e in self.layer_list if e.created_inside_model]

    @property
    def module_addresses(self) -> List[str]:
        return list(self.modules.addresses)

    @property
    def module_types(self) -> Dict[str, str]:
        return {a: self.modules.types[a] for a in self.modules.addresses}

    @property
    def module_passes(self) -> Dict[str, int]:
        return dict(self.modules.passes)

    @property
    def num_tensors(self) -> int:
        """Tensors computed in the forward pass (``len(history)`` counts those kept here)."""
        return self.pass_stats.num_tensors

    @property
    def num_tensors_saved(self) -> int:
        return sum(1 for e in self.layer_list if e.has_saved_activation)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of all tensors computed in the forward pass."""
        return self.pass_stats.tensor_bytes

    @property
    def saved_tensor_bytes(self) -> int:
        return sum(e.saved_nbytes for e in self.layer_list)

    @property
    def num_params(self) -> int:
        return sum(numel for _, numel, _ in self.param_info.values())

    @property
    def param_bytes(self) -> int:
        return sum(nbytes for _, _, nbytes in self.param_info.values())

    @property
    def num_param_tensors(self) -> int:
        return len(self.param_info)

    @property
    def num_param_operations(self) -> int:
        return self.pass_stats.num_param_operations

    @property
    def max_passes(self) -> int:
        return self.pass_stats.max_passes

    @property
    def is_recurrent(self) -> bool:
        return self.max_passes > 1

    @property
    def is_branching(self) -> bool:
        return self.pass_stats.is_branching

    @property
    def has_conditional_branching(self) -> bool:
        """Some tensor was converted to a Python bool that steered control flow."""
        return self.pass_stats.has_conditional_branching

    @property
    def conditional_layers(self) -> List[str]:
        """Layers whose value was used as a Python bool (``if x.mean() > 0:``)."""
        return [e.label for e in self.layer_list if e.bool_used]

    @property
    def rolled_layers(self) -> Dict[str, "RolledLayer"]:
        """One ``RolledLayer`` per layer (passes folded together), in order of first pass."""
        if self._rolled is None:
            self._rolled = roll(self.layer_list)
        return self._rolled

    @property
    def layer_list_rolled(self) -> List["RolledLayer"]:
        return list(self.rolled_layers.values())

    @property
    def elapsed_time(self) -> float:
        return self.pass_time + self.postprocess_time

    # ----- printing and export --------------------------------------------------------------
    def __str__(self) -> str:
        """What ``print(history)`` shows: for a pass of at most 60 layers, the header, the module
        hierarchy and every layer numbered (``0: input_1_0`` ...), as ``print_layers``; for a
        larger one, the header and one row per module with runs of identical blocks folded
        (``h.0-5  GPT2Block x6``; see ``summary`` for every row)."""
        text = summary_text(self, auto=True)
        return type(text)(visible(text))  # a loaded history's names must not act on the terminal

    def summary(self, depth: Optional[int] = None) -> str:
        """The header (model, operations, totals, notes) and one row per module: its address
        indented by depth, class, number of calls, output shape of its first call, parameters
        (its own and its submodules') and bytes of saved activations computed inside it.
        ``depth=N`` shows modules at most N levels deep (1: the top-level ones). ``print(history)``
        of a large pass shows this table with identical blocks folded, at most 250 rows.
        ``print_layers()`` lists every layer instead.

        Example:
            >>> import torch, torchlens as tl
            >>> model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(3, 3)), torch.nn.ReLU())
            >>> h = tl.log_forward_pass(model, torch.ones(1, 3))
            >>> text = h.summary(depth=1)
            >>> print(text[text.index("Module"):])  # doctest: +NORMALIZE_WHITESPACE
            Module  Class       Calls  Output shape  Params  Saved
            0       Sequential      1  (1, 3)            12   12 B
            1       ReLU            1  (1, 3)             0   12 B
            <BLANKLINE>
            4 layers: history.print_layers() lists every one; 1 deeper module not shown: history.summary() shows all.
        """
        text = summary_text(self, depth=depth)
        return type(text)(visible(text))

    def print_layers(self) -> None:
        """Print the header, the module hierarchy and one line per layer, in execution order.

        Example:
            >>> import torch, torchlens as tl
            >>> h = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
            >>> h.print_layers()  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
            Log of Linear forward pass:
            ...
            Layers:
                0: input_1_0
                1: linear_1_1
                2: output_1_2
        """
        print(visible(layers_text(self)))

    def __repr__(self) -> str:
        return self.__str__()

    def _repr_svg_(self) -> Optional[str]:
        """The unrolled graphviz drawing for notebook viewers without JavaScript; None (the page or
        the text summary) when graphviz's ``dot`` is missing or the drawing is too large to inline."""
        svg: Callable[[ModelHistory], Optional[str]] = extension("svg")
        return svg(self)

    def _repr_html_(self) -> str:
        """Jupyter shows the history as its interactive graph page, inline and offline (``show``)."""
        page: Callable[[ModelHistory], str] = extension("notebook_html")
        return page(self)

    def _repr_mimebundle_(
        self, include: Optional[Iterable[str]] = None, exclude: Optional[Iterable[str]] = None
    ) -> Dict[str, str]:
        """Every form at once, so each front end picks what it can show: the page (``text/html``),
        the drawing while small (``image/svg+xml``) and the summary (``text/plain``)."""
        bundle: Callable[[ModelHistory, Optional[Iterable[str]], Optional[Iterable[str]]], Dict[str, str]] = extension(
            "mimebundle"
        )
        return bundle(self, include, exclude)

    def to_html(
        self, path: Optional[str] = None, overlay: Optional[Mapping[str, object]] = None, focus: Optional[str] = None
    ) -> str:
        """The interactive graph page: one self-contained HTML file (no server, no network) with
        every operation, modules that open and close, folded repeated blocks, search and details.
        Returns the HTML text, and writes it to ``path`` when given. ``overlay``: a value per
        label (``{label: number or category}``, or ``{"values": {...}, "name": ..., "scale":
        "sequential" | "diverging" | "categorical", "log": ..., "colors": ...}``) colouring the
        nodes, with a legend; ``focus``: the label the page opens on (modules open, details shown).

        Example:
            >>> import torch, torchlens as tl
            >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
            >>> h.to_html().startswith("<!doctype html>")
            True
        """
        path = None if path is None else require_path("path", path, "history.to_html", new=True)
        require_str("focus", focus, "history.to_html", optional=True)
        page: Callable[..., str] = extension("to_html")  # (history, path, overlay=, focus=)
        return page(self, path, overlay=overlay, focus=focus)

    def show(self, height: int = 640) -> None:
        """Show the interactive graph page inline in Jupyter, ``height`` pixels tall and as wide as
        the cell: packed into an isolated iframe (no server, no network; see ``to_html``), drawn
        once scrolled into view. It returns None, so ending a cell with it shows the page once.
        Outside a notebook it raises ``RuntimeError``.

        Example:
            >>> import torch, torchlens as tl
            >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
            >>> h.show(height=400)  # doctest: +SKIP
        """
        require_int("height", height, "history.show", minimum=100, maximum=100_000)  # pixels
        show: Callable[[ModelHistory, int], None] = extension("show")
        show(self, height)

    def to_pandas(self) -> pandas.DataFrame:
        """One row per entry (layer pass), columns as in ``TensorLogEntry.to_row``."""
        try:
            import pandas as pd
        except ImportError as error:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from error
        return pd.DataFrame([e.to_row() for e in self.layer_list])

    def save(self, path: str, overwrite: bool = False) -> str:
        """Write this history to the folder ``path``: ``torchlens.json`` (structure, metadata,
        call stacks with their source text) and ``tensors-*.safetensors`` (activations,
        gradients, saved function arguments). No pickle; ``torchlens.load(path)`` opens it
        lazily. Values that cannot be stored as they are (arbitrary objects among function
        arguments, non-tensor ``activation_postfunc`` results) are kept as placeholders and
        named in an ``UnsavedValuesWarning``. Returns ``path``.

        Example:
            >>> import tempfile, torch, torchlens as tl
            >>> h = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
            >>> folder = h.save(tempfile.mkdtemp() + "/run")
            >>> torch.equal(tl.load(folder)['linear_1_1'].activation, h['linear_1_1'].activation)
            True
        """
        path = require_path("path", path, "history.save", new=True)
        require_bool("overwrite", overwrite, "history.save")
        save: Callable[..., str] = extension("save")  # (history, path, overwrite=)
        return save(self, path, overwrite=overwrite)

    def export(
        self, path: str, format: Optional[str] = None, overwrite: bool = False, weights: Optional[nn.Module] = None
    ) -> str:
        """Write this history for another tool: ``format="netron"`` (an ONNX graph: ONNX's JSON
        form, or a binary model for a ``.onnx`` path; ``weights=model`` stores parameter values),
        ``"model_explorer"`` (Google Model Explorer's JSON graph, modules as boxes),
        ``"chrome_trace"`` (Perfetto / chrome://tracing: a slice per operation, a track per
        module depth) or ``"parquet"`` (the ``to_pandas`` table; the default for a ``.parquet``
        path). An existing file is replaced only with ``overwrite=True``. Returns ``path``
        (``torchlens.trace.export`` describes each format).

        Example:
            >>> import tempfile, torch, torchlens as tl
            >>> h = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
            >>> h.export(tempfile.mkdtemp() + "/model.json", format="model_explorer").endswith("model.json")
            True
        """
        path = require_path("path", path, "history.export", new=True)
        require_str("format", format, "history.export", optional=True)
        require_bool("overwrite", overwrite, "history.export")
        if weights is not None:
            require_instance(
                "weights", weights, "history.export", nn.Module, takes="the model whose parameters to store"
            )
        export: Callable[..., str] = extension("export")  # (history, path, format=, overwrite=, weights=)
        return export(self, path, format=format, overwrite=overwrite, weights=weights)

    def rerun(self, changes: Mapping[Key, Change]) -> "ModelHistory":
        """A new history in which the named layers have new values (a tensor, or a function
        ``fn(activation, entry)`` returning one) and every layer downstream is recomputed from
        the saved graph (each operation re-run on its parents' values), without running the
        model. Needs a history traced with ``save_function_args=True`` and the activations of
        the layers it recomputes from; otherwise ``RerunError`` says what is missing.

        Example:
            >>> import torch, torchlens as tl
            >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
            >>> h = tl.log_forward_pass(model, torch.ones(1, 3), save_function_args=True)
            >>> h.rerun({'linear_1_1': torch.tensor([[-1.0, 2.0]])})['relu_1_2'].activation
            tensor([[0., 2.]])
        """
        rerun: Callable[[ModelHistory, Mapping[Key, Change]], ModelHistory] = extension("rerun")
        return rerun(self, changes)

    def first_nonfinite(self) -> Any:  # a NonfiniteReport (trace/answers, a layer above: not importable here)
        """Where NaN or Inf first appeared among the saved activations: a ``NonfiniteReport``
        (see ``torchlens.find_nonfinite``, which needs no saved activations and also checks
        parameters and backward). Layers whose activation was not saved count as unknown.

        Example:
            >>> import torch, torchlens as tl
            >>> class Log(torch.nn.Module):
            ...     def forward(self, x):
            ...         return torch.log(x) * 2
            >>> h = tl.log_forward_pass(Log(), torch.tensor([-1.0, 1.0]))
            >>> report = h.first_nonfinite()
            >>> report.label, report.kind, report.propagated
            ('log_1_1', 'nan', ['mul_1_2', 'output_1_3'])
        """
        return extension("first_nonfinite")(self)

    def attention(self, module: Optional[str] = None) -> torch.Tensor:
        """The attention probabilities ``[batch, heads, queries, keys]`` of one call of ``module``
        (``'h.0.attn'``; ``'h.0.attn:2'`` for its second call; None: the pass's only attention call), from a pass logged with
        ``decompose=('sdpa',)``; ``AttentionNotFoundError`` says what to change otherwise.

        Example:
            >>> import torch, torchlens as tl
            >>> mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
            >>> x = torch.rand(1, 5, 8)
            >>> h = tl.log_forward_pass(mha, (x, x, x), {"need_weights": False}, decompose=("sdpa",))
            >>> p = h.attention()
            >>> p.shape, torch.allclose(p.sum(-1), torch.ones(1, 2, 5))
            (torch.Size([1, 2, 5, 5]), True)
        """
        from .attention import attention  # noqa: PLC0415 - only histories that ask for it

        return attention(self, module)

    def module_output(self, address: str) -> Optional[TensorLogEntry]:
        """The entry a module's (single-pass) output is, or None if the module did not run."""
        found = self._lookup.get(address)
        return found if isinstance(found, TensorLogEntry) else None


def as_key(key: Any) -> Union[str, int]:
    """A lookup key: a string, or an int from any integer type (``numpy.int64``, a 0-d integer
    tensor); bools and other types raise ``TypeError``."""
    if isinstance(key, str) or (type(key) is int):
        return key
    if not isinstance(key, (bool, float)) and type(key).__name__ not in ("bool_", "bool"):
        try:
            return operator.index(key)
        except TypeError:
            pass
    raise TypeError(
        f"ModelHistory keys are layer labels, module addresses, ints or slices, not {type(key).__name__} ({key!r})"
    )


__all__ = ["ModelHistory", "ModuleInfo", "PassStats", "as_key"]
