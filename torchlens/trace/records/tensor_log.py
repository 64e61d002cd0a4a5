"""``TensorLogEntry``: the record of one tensor produced in the forward pass (one layer pass)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

import torch

from .entry_row import EntryRow
from .format import human_bytes, tensor_preview
from .func_call import CodeLike, FuncCallLocation
from .position import OpRngState, Position
from .visible_text import visible

# Fields written while the pass runs (cheap facts that cannot be derived later).
_CAPTURE_FIELDS = (
    "raw_index",  # position in execution order before pruning
    "func",  # the torch callable applied (None for inputs, buffers)
    "func_name",  # e.g. "conv2d", "__add__"
    "layer_type",  # e.g. "conv2d", "add", "input"
    "kind",  # "op", "input", "output", "buffer", or "untraced" (made by a call torchlens does not trace)
    "address",  # input/output/buffer address, e.g. "input.x", "output.0", "bn.running_mean"
    "parent_refs",  # [(parent entry, position in the call's arguments)], dropped after post-processing
    "param_addresses",  # addresses of the parameters the operation used
    "module_stack",  # ((module address, pass), ...) outermost first
    "call_frames",  # ((code, line, bytecode offset), ...) from the model's forward to the call
    "elapsed",  # seconds the function took
    "is_inplace",  # the operation mutated its input (relu_, +=, x[i] = v)
    "output_index",  # position of this tensor among the call's outputs (None for a single output)
    "shape",
    "dtype",
    "nbytes",
    "grad_fn_name",
    "activation",  # saved copy, or None
    "func_args",  # with ``save_function_args``: args with parents replaced by ParentRef
    "func_kwargs",
    "output_of_modules",  # [(module address, pass)], innermost first
    "bool_used",  # the tensor was converted to a Python bool (if/while on a tensor)
    "stored_as_buffer",  # buffer address, when the model assigned this tensor to a buffer
    "branch_condition_record",  # first operation after a bool conversion: the condition's record
    "gradient",  # with save_gradients: the gradient that reached this tensor in backward
    "rng_state",  # with save_function_args, for random operations: generator states before the call
    "untraced_reason",  # untraced nodes: why the tensor has no record (see Tracer.untraced)
    "intervened",  # the activation was replaced (log_forward_pass(intervene=...), rerun): how, as text
)

# Fields filled by post-processing.
_DERIVED_FIELDS = (
    "label",  # e.g. "linear_1_1:2" (pass suffix only when the layer has several passes)
    "layer_label",  # without pass: "linear_1_1"
    "short_label",  # without overall number: "linear_1"
    "type_index",  # k: the k-th layer of its type
    "layer_index",  # n: the n-th layer overall
    "pass_num",
    "num_passes",
    "parent_layers",
    "child_layers",
    "parent_arg_positions",  # {parent label: [positions]}
    "param_shapes",
    "num_params",
    "param_bytes",
    "created_inside_model",
    "lookup_keys",
    "operation_num",  # 1-based position in the forward pass (as printed: "operation 8/24")
    "num_operations",  # tensors in the forward pass
    "module_passes",  # {address: num passes} of the history, for printing
    "module_output_positions",  # {(module address, pass): where this tensor sat in that call's output}
    "call_outputs",  # labels of all outputs of this tensor's call, when the function returned several
    "gradient_note",  # with save_gradients: why no gradient can reach this tensor (reentrant checkpoint)
    "branch_condition",  # first operation after a bool conversion: the condition's label
)
_ALL_FIELDS = _CAPTURE_FIELDS + _DERIVED_FIELDS


class ParentRef:
    """Placeholder in saved function arguments for the activation of a parent layer.

    During capture it holds the parent's ``record`` (labels do not exist yet); post-processing
    names the parent (``name_parent``), after which ``label`` is its label and ``record`` None.
    """

    __slots__ = ("label", "record")

    def __init__(self, label: Optional[str] = None, record: Optional["TensorLogEntry"] = None) -> None:
        self.label = label
        self.record = record

    def name_parent(self) -> None:
        """Post-processing: replace the parent's record by its label."""
        if self.record is not None:
            self.label, self.record = self.record.label, None

    def __repr__(self) -> str:
        return f"ParentRef({self.label!r})"


# Values of the fields of a new record; every other field starts as None.
_INITIAL_VALUES = {
    "parent_refs": "[]",
    "param_addresses": "()",
    "module_stack": "()",
    "call_frames": "()",
    "elapsed": "0.0",
    "is_inplace": "False",
    "output_of_modules": "[]",
    "bool_used": "False",
}


# Fields held in a slot of another name, behind a property: ``lookup_keys`` is found when first
# read (a history builds its key index on first use, see ModelHistory)
_SLOT_OF = {"lookup_keys": "_lookup_keys"}


class _InitFields(Protocol):
    """The signature of the generated ``init_fields`` (see ``_make_init_fields``)."""

    def __call__(
        self,
        e: TensorLogEntry,
        raw_index: int,
        kind: str,
        layer_type: str,
        func: Optional[Callable[..., Any]],
        func_name: str,
    ) -> None: ...


def _make_init_fields() -> _InitFields:
    """One straight-line function that sets every field of a new record: a record is made per
    operation, and a loop of ``setattr`` over 60 names cost more than the rest of its logging.
    It is ``TensorLogEntry.__init__`` itself (set below the class): one call per record, not two."""
    given = ("raw_index", "kind", "layer_type", "func", "func_name")
    names = [_SLOT_OF.get(name, name) for name in _ALL_FIELDS] + ["_history"]
    lines = [f"    e.{name} = {name if name in given else _INITIAL_VALUES.get(name, 'None')}" for name in names]
    source = f"def __init__(e, {', '.join(given)}):\n" + "\n".join(lines) + "\n"
    namespace: Dict[str, _InitFields] = {}
    exec(source, namespace)  # noqa: S102 - source built above from the field names only
    return namespace["__init__"]


_init_fields = _make_init_fields()


# The notebook card of an entry is drawn by trace/render/cards.py, a layer above records (it
# imports records): it registers itself here when imported, and _repr_html_ imports it on first use.
_CARD_PROVIDER = "torchlens.trace.render.cards"
_CARD: List[Callable[["TensorLogEntry"], str]] = []


def provide_card(render: Callable[["TensorLogEntry"], str]) -> None:
    """Register ``render(entry) -> HTML`` as the notebook card of a ``TensorLogEntry``."""
    _CARD[:] = [render]


class TensorLogEntry:
    """One tensor computed during the forward pass, with its activation and metadata.

    Example:
        >>> import torch, torchlens as tl
        >>> h = tl.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()),
        ...                         torch.ones(1, 3))
        >>> e = h['relu_1_2']
        >>> e.parent_layers, e.containing_module
        (['linear_1_1'], '1')
    """

    # __weakref__: gradient hooks refer to their entry weakly (see capture.gradients.record_gradient);
    # _history: the history whose index gives ``lookup_keys`` (weakly: it holds the entry)
    __slots__ = tuple(_SLOT_OF.get(name, name) for name in _ALL_FIELDS) + ("_history", "__weakref__")

    if TYPE_CHECKING:  # the fields above, typed for readers and the type checker
        raw_index: int
        func: Optional[Callable[..., Any]]
        func_name: str
        layer_type: str
        kind: str
        address: Optional[str]
        parent_refs: Sequence[Tuple[TensorLogEntry, Position]]  # a list during the pass, () after
        param_addresses: Tuple[str, ...]
        module_stack: Tuple[Tuple[str, int], ...]
        call_frames: Tuple[Tuple[CodeLike, int, int], ...]  # (code, line, bytecode offset)
        elapsed: float
        is_inplace: bool
        output_index: Optional[Position]
        # torch.Size; a nested tensor's is a tuple with None for its ragged dimensions
        # (capture/args.nested_shape). Any until render/structure.py's CollapsedModule.outputs
        # takes Tuple[Optional[int], ...] (the honest type; that module is not strict yet)
        shape: Any
        dtype: Optional[torch.dtype]
        nbytes: int
        grad_fn_name: Optional[str]
        activation: Any  # a tensor, or whatever ``activation_postfunc`` returned
        func_args: Optional[Tuple[Any, ...]]  # user arguments, parents replaced by ParentRef
        func_kwargs: Optional[Dict[str, Any]]
        output_of_modules: List[Tuple[str, int]]
        bool_used: bool
        stored_as_buffer: Optional[str]
        branch_condition_record: Optional[TensorLogEntry]
        gradient: Optional[torch.Tensor]
        rng_state: Optional[OpRngState]
        untraced_reason: Optional[str]
        intervened: Optional[str]
        label: str
        layer_label: str
        short_label: str
        type_index: int
        layer_index: int
        pass_num: int
        num_passes: int
        parent_layers: List[str]
        child_layers: List[str]
        parent_arg_positions: Dict[str, List[Position]]
        param_shapes: List[torch.Size]
        num_params: int
        param_bytes: int
        created_inside_model: Optional[bool]
        _lookup_keys: Optional[List[Union[int, str]]]
        _history: Optional[Callable[[], Any]]
        operation_num: int
        num_operations: int
        module_passes: Dict[str, int]
        module_output_positions: Optional[Dict[Tuple[str, int], Position]]
        call_outputs: Optional[List[str]]
        gradient_note: Optional[str]
        branch_condition: Optional[str]

    def __init__(
        self, raw_index: int, kind: str, layer_type: str, func: Optional[Callable[..., Any]], func_name: str
    ) -> None:
        _init_fields(self, raw_index, kind, layer_type, func=func, func_name=func_name)  # replaced below the class

    @property
    def lookup_keys(self) -> Optional[List[Union[int, str]]]:
        """Every key that finds this entry in its history (``history[key]``): its two ordinals,
        then the names that name it alone, sorted. Found when first read (the history builds its
        key index on first use); None for an entry of no history."""
        keys = self._lookup_keys
        if keys is None and self._history is not None:
            history = self._history()
            if history is not None:
                history.lookup_value(0)  # builds the history's index, which gives every entry its keys
                keys = self._lookup_keys
        return keys

    @lookup_keys.setter
    def lookup_keys(self, keys: Optional[List[Union[int, str]]]) -> None:
        self._lookup_keys = keys

    # ----- views of the fields -------------------------------------------------------------
    @property
    def has_saved_activation(self) -> bool:
        return self.activation is not None

    @property
    def saved_nbytes(self) -> int:
        """Bytes of the saved activation (0 when not saved or not a tensor)."""
        a = self.activation
        return a.nelement() * a.element_size() if isinstance(a, torch.Tensor) else 0

    @property
    def is_input(self) -> bool:
        return self.kind == "input"

    @property
    def is_output(self) -> bool:
        return self.kind == "output"

    @property
    def is_buffer(self) -> bool:
        return self.kind == "buffer"

    @property
    def is_untraced(self) -> bool:
        """A tensor made by a call torchlens does not trace: its producer and inputs are unknown."""
        return self.kind == "untraced"

    @property
    def uses_params(self) -> bool:
        return bool(self.param_addresses)

    @property
    def containing_module(self) -> Optional[str]:
        """Address of the innermost module this operation ran in (``'features.6'``)."""
        return self.module_stack[-1][0] if self.module_stack else None

    @property
    def containing_modules(self) -> List[str]:
        """Every module the operation ran in, outermost first, as ``address:pass``."""
        return [f"{a}:{p}" for a, p in self.module_stack]

    @property
    def modules_output_of(self) -> List[str]:
        """Modules whose output this tensor is, innermost first, as ``address:pass``."""
        return [f"{a}:{p}" for a, p in self.output_of_modules]

    @property
    def bottom_level_module_output(self) -> Optional[str]:
        return f"{self.output_of_modules[0][0]}:{self.output_of_modules[0][1]}" if self.output_of_modules else None

    @property
    def func_call_stack(self) -> List[FuncCallLocation]:
        """Source locations from the model's ``forward`` down to the line that made the call."""
        return [FuncCallLocation(code, line) for code, line, _ in self.call_frames]

    @property
    def has_gradient(self) -> bool:
        return self.gradient is not None

    @property
    def grad_shape(self) -> Optional[torch.Size]:
        return self.gradient.shape if self.gradient is not None else None

    @property
    def grad_dtype(self) -> Optional[torch.dtype]:
        return self.gradient.dtype if self.gradient is not None else None

    @property
    def grad_nbytes(self) -> int:
        g = self.gradient
        return g.nelement() * g.element_size() if g is not None else 0

    @property
    def tensor_size_text(self) -> str:
        return human_bytes(self.nbytes or 0)

    # ----- printing ------------------------------------------------------------------------
    def _module_text(self, address: str, pass_num: int) -> str:
        passes = (self.module_passes or {}).get(address, 1)
        return address if passes == 1 else f"{address}:{pass_num}"

    def call_note(self) -> str:
        """``' (output 2 of 3 of one lstm call)'`` for an output of a multi-output call, else ``''``."""
        if not self.call_outputs or self.label not in self.call_outputs:
            return ""
        return (
            f" (output {self.call_outputs.index(self.label) + 1} of {len(self.call_outputs)} "
            f"of one {self.func_name} call)"
        )

    def _module_output_text(self, address: str, pass_num: int) -> str:
        """``'lstm'``, or ``'lstm (output 1.0)'`` when the call returned a container of tensors."""
        position = (self.module_output_positions or {}).get((address, pass_num), ())
        if position == ():
            return self._module_text(address, pass_num)
        path = ".".join(map(str, position if isinstance(position, tuple) else (position,)))
        return f"{self._module_text(address, pass_num)} (output {path})"

    def __str__(self) -> str:
        shape = tuple(self.shape) if self.shape is not None else None
        lines = [f"Layer {self.label}, operation {self.operation_num}/{self.num_operations}:"]
        lines.append(f"\tOutput tensor: shape={shape}, dtype={self.dtype}, size={self.tensor_size_text}")
        if self.activation is not None:
            lines.append("\t\t" + tensor_preview(self.activation).replace("\n", "\n\t\t"))
        else:
            lines.append("\t\t(activation not saved)")
        if self.gradient is not None:
            lines.append(
                f"\tGradient: shape={tuple(self.gradient.shape)}, dtype={self.gradient.dtype}, "
                f"size={human_bytes(self.grad_nbytes)}"
            )
            lines.append("\t\t" + tensor_preview(self.gradient).replace("\n", "\n\t\t"))
        elif self.gradient_note:
            lines.append(f"\tGradient: {self.gradient_note}")
        if self.param_addresses:
            shapes = ", ".join(str(tuple(s)) for s in self.param_shapes)
            lines.append(
                f"\tParams: Computed from params with shape {shapes}; {self.num_params} params total "
                f"({human_bytes(self.param_bytes)})"
            )
        else:
            lines.append("\tParams: no params used")
        if self.kind == "untraced":
            lines.append(f"\tUntraced producer: {self.untraced_reason}; its inputs are unknown")
        if self.address:
            lines.append(f"\tAddress: {self.address}")
        if self.stored_as_buffer:
            lines.append(f"\tStored as buffer: {self.stored_as_buffer}")
        lines.append(f"\tParent Layers: {', '.join(self.parent_layers) or 'no parent layers'}")
        lines.append(f"\tChild Layers: {', '.join(self.child_layers) or 'no child layers'}")
        if self.func is not None:
            lines.append(f"\tFunction: {self.func_name} (grad_fn={self.grad_fn_name}){self.call_note()}")
        if self.call_outputs:
            lines.append(f"\tOutputs of the same call: {', '.join(self.call_outputs)}")
        if self.module_stack and self.kind == "untraced":  # where it was made is unknown
            lines.append(f"\tFirst used inside module: {self._module_text(*self.module_stack[-1])}")
        elif self.module_stack:
            lines.append(f"\tComputed inside module: {self._module_text(*self.module_stack[-1])}")
        else:
            lines.append("\tComputed inside module: not computed inside a module")
        lines.append(f"\tTime elapsed: {self.elapsed:.3E}s")
        if self.output_of_modules:
            outs = ", ".join(self._module_output_text(a, p) for a, p in self.output_of_modules)
            lines.append(f"\tOutput of modules: {outs}")
            lines.append(f"\tOutput of bottom-level module: {self._module_text(*self.output_of_modules[0])}")
        else:
            lines.append("\tOutput of modules: none")
        flags = [
            f
            for f, on in (
                ("in-place", self.is_inplace),
                ("created inside model", self.created_inside_model),
                ("converted to bool (steers control flow)", self.bool_used),
            )
            if on
        ]
        if flags:
            lines.append(f"\tFlags: {', '.join(flags)}")
        if self.branch_condition:
            lines.append(f"\tStarts a branch chosen by: {self.branch_condition}")
        if self.intervened:
            lines.append(f"\tIntervened: {self.intervened}")
        lines.append(f"\tLookup keys: {', '.join(str(k) for k in self.lookup_keys or ())}")
        return visible("\n".join(lines))  # a loaded history's labels must not act on the terminal

    def __repr__(self) -> str:
        return self.__str__()

    def _repr_html_(self) -> str:
        """Jupyter shows an entry as a card: shape, dtype, statistics and a histogram of its
        values, parents, children, module and source line (``print(entry)`` gives every field)."""
        if not _CARD:
            importlib.import_module(_CARD_PROVIDER)  # registers the card
        return _CARD[0](self)

    def to_row(self) -> EntryRow:
        """One flat dict of the entry's metadata (what ``ModelHistory.to_pandas`` tabulates)."""
        return {
            "label": self.label,
            "layer_label": self.layer_label,
            "layer_type": self.layer_type,
            "type_index": self.type_index,
            "layer_index": self.layer_index,
            "pass_num": self.pass_num,
            "num_passes": self.num_passes,
            "operation_num": self.operation_num,
            "kind": self.kind,
            "untraced_reason": self.untraced_reason,
            "address": self.address,
            "func_name": self.func_name,
            "grad_fn_name": self.grad_fn_name,
            "shape": tuple(self.shape) if self.shape is not None else None,
            "dtype": str(self.dtype) if self.dtype is not None else None,
            "nbytes": self.nbytes,
            "has_saved_activation": self.has_saved_activation,
            "has_gradient": self.has_gradient,
            "grad_shape": tuple(self.gradient.shape) if self.gradient is not None else None,
            "grad_nbytes": self.grad_nbytes,
            "gradient_note": self.gradient_note,
            "parent_layers": list(self.parent_layers),
            "child_layers": list(self.child_layers),
            "param_addresses": list(self.param_addresses),
            "num_params": self.num_params,
            "param_bytes": self.param_bytes,
            "containing_module": self.containing_module,
            "containing_modules": self.containing_modules,
            "modules_output_of": self.modules_output_of,
            "is_inplace": self.is_inplace,
            "created_inside_model": self.created_inside_model,
            "bool_used": self.bool_used,
            "stored_as_buffer": self.stored_as_buffer,
            "branch_condition": self.branch_condition,
            "elapsed": self.elapsed,
            "intervened": self.intervened,
        }


# the generated initialiser is the constructor itself (the ``__init__`` above states its signature)
TensorLogEntry.__init__ = _init_fields  # type: ignore[assignment, method-assign]
