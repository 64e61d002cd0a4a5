"""Values of a history <-> JSON. Nothing is pickled, and decoding never runs code from the file.

Every JSON object is a tagged value ``{"t": tag, ...}``; lists are lists; strings, numbers,
booleans and null are themselves. Tensors go to the shards (``ShardWriter``) and are referred
to by number; functions are stored by name, and a loaded name becomes a function only if it is
an operation the tracer records (``allowlist.py``; anything else is an ``UnavailableFunction``
that is never called); references to other layers
are stored by label. A value of any other type is stored as an ``unsaved`` placeholder holding
its type and ``repr`` and is reported by the save (never silently dropped).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..records.func_call import DetachedCode
from ..records.tensor_log import ParentRef, TensorLogEntry
from .allowlist import Refused, replayable_function, resolve_name
from .errors import HistoryFileError, UnreplayableFunctionError
from .shards import ShardWriter, TensorStore, decode_tensor, dtype_name, dtype_of, encode_tensor

_TORCH_ENUMS = (torch.layout, torch.memory_format, torch.qscheme)
_REPR_CHARS = 200
_MAX_DEPTH = 64  # deepest value a loaded file may hold


class Unsaved:
    """Stands in, in a loaded history, for a value that could not be saved (an arbitrary object
    among a function's arguments, a non-tensor ``activation_postfunc`` result...).

    Example:
        >>> Unsaved("mymodule.Config", "Config(depth=3)")
        <unsaved mymodule.Config: Config(depth=3)>
    """

    __slots__ = ("type_name", "text")

    def __init__(self, type_name: str, text: str) -> None:
        self.type_name = type_name
        self.text = text

    def __repr__(self) -> str:
        return f"<unsaved {self.type_name}: {self.text}>"


class UnavailableFunction:
    """The function of a loaded layer that is not called: it could not be found by name when the
    history was saved (a user's function or lambda), or the name in the file is not an operation
    torchlens traces (see ``allowlist``). Printing works; calling it (``rerun``, validation) raises
    and says why.

    Example:
        >>> f = UnavailableFunction("builtins.eval", "builtins.eval", reason="not an operation torchlens traces")
        >>> f.unavailable_reason
        'the saved function builtins.eval is not an operation torchlens traces, so this layer cannot be re-run'
    """

    __slots__ = ("name", "text", "reason")

    def __init__(self, name: str, text: str, reason: Optional[str] = None) -> None:
        self.name = name
        self.text = text
        self.reason = reason

    @property
    def unavailable_reason(self) -> str:
        """Why this function is not called (read by ``replay.replay_entry`` before any call)."""
        if self.reason is None:
            return (
                f"the function {self.text} of this loaded history could not be found by name when it was "
                "saved (it is not a torch or torchlens function), so it cannot be re-run"
            )
        return f"the saved function {self.text} is {self.reason}, so this layer cannot be re-run"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise UnreplayableFunctionError(f"torchlens: {self.unavailable_reason}.")

    def __repr__(self) -> str:
        return f"<unavailable function {self.text}>"


def _type_name(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def _clipped_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as error:  # noqa: BLE001 - a broken __repr__ must not stop the save
        text = f"(repr failed: {type(error).__name__})"
    return text if len(text) <= _REPR_CHARS else text[:_REPR_CHARS] + "..."


_FUNC_NAMES: Dict[int, Optional[str]] = {}


def function_name(func: Any) -> Optional[str]:
    """A dotted name under which ``func`` is found again by attribute lookup (``'torch.relu'``,
    ``'torch.Tensor.__add__'``), or None."""
    key = id(func)
    if key in _FUNC_NAMES:
        return _FUNC_NAMES[key]
    found = None
    name = getattr(func, "__name__", None)
    candidates = []
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        candidates.append(f"{module}.{qualname}")
    if isinstance(name, str):
        candidates += [
            f"{ns}.{name}"
            for ns in (
                "torch",
                "torch.Tensor",
                "torch.nn.functional",
                "torch.linalg",
                "torch.fft",
                "torch.special",
                "torch._C._nn",
                "torch._C._VariableFunctions",
                "operator",
                "math",
            )
        ]
    if isinstance(func, torch._ops.OpOverload):
        candidates.insert(0, f"torch.ops.{func.namespace}.{func._opname}.{func._overloadname}")
    elif isinstance(func, torch._ops.OpOverloadPacket):
        candidates.insert(0, f"torch.ops.{str(func)}" if not str(func).startswith("torch.ops") else str(func))
    for candidate in candidates:
        try:
            if resolve_function(candidate) is func:
                found = candidate
                break
        except LookupError:
            continue
    _FUNC_NAMES[key] = found
    return found


def resolve_function(name: str) -> Any:
    """The object at dotted ``name`` inside an already-imported module (never imports; see
    ``allowlist.resolve_name``). What a loaded history may call is ``replayable_function``."""
    return resolve_name(name)


class Written:
    """A value already written during the pass (``save_to``): its JSON form."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data


class Encoder:
    """Turns values into JSON, tensors into shard records. With ``dedupe`` each tensor object
    is written once (the tensors are kept alive until the save ends, so ids stay unique);
    without it (while a ``save_to`` pass runs) nothing is kept alive."""

    def __init__(self, writer: ShardWriter, dedupe: bool = True) -> None:
        self.dedupe = dedupe
        self.writer = writer
        self.tensors: List[Dict[str, Any]] = []  # index records, position = tensor number
        self._ids: Dict[int, int] = {}
        self._alive: List[torch.Tensor] = []  # ids stay unique while the save runs
        self.unsaved: List[Tuple[str, str]] = []  # (where, what)
        self.where = ""

    def tensor(self, tensor: torch.Tensor) -> Any:
        if tensor.is_meta:  # no values: its description is the whole tensor
            return {
                "t": "meta",
                "shape": list(tensor.shape),
                "dtype": dtype_name(tensor.dtype),
                "parameter": isinstance(tensor, torch.nn.Parameter),
                "requires_grad": bool(tensor.requires_grad),
            }
        number = self._ids.get(id(tensor)) if self.dedupe else None
        if number is None:
            record = encode_tensor(tensor, self.writer)
            if record is None:
                return self._unsaved(tensor, f"a {tensor.layout} tensor of type {type(tensor).__name__}")
            record["requires_grad"] = bool(tensor.requires_grad)
            record["parameter"] = isinstance(tensor, torch.nn.Parameter)
            record["device"] = str(tensor.device)
            number = len(self.tensors)
            self.tensors.append(record)
            if self.dedupe:
                self._ids[id(tensor)] = number
                self._alive.append(tensor)
        return {"t": "tensor", "k": number}

    def _unsaved(self, value: Any, what: Optional[str] = None) -> Dict[str, Any]:
        self.unsaved.append((self.where, what or _type_name(value)))
        return {"t": "unsaved", "type": _type_name(value), "repr": _clipped_repr(value)}

    def value(self, value: Any, depth: int = 0) -> Any:
        """The JSON form of ``value`` (see the module docstring)."""
        cls = type(value)
        if value is None or cls is bool or cls is str or cls is int:
            return value
        if cls is float:
            return value if math.isfinite(value) else {"t": "float", "v": repr(value)}
        if isinstance(value, torch.Tensor):
            return self.tensor(value)
        if depth > 40:
            return self._unsaved(value, "a value nested too deeply")
        if cls is list:
            return [self.value(v, depth + 1) for v in value]
        if cls is tuple or isinstance(value, tuple) and not hasattr(value, "_fields") and cls is not torch.Size:
            return {"t": "tuple", "v": [self.value(v, depth + 1) for v in value]}
        if cls is torch.Size:
            return {"t": "size", "v": list(value)}
        if isinstance(value, tuple):  # a namedtuple: its fields, by name
            return {
                "t": "namedtuple",
                "name": cls.__name__,
                "fields": list(getattr(value, "_fields")),  # noqa: B009 - tuple has no _fields to the checker
                "v": [self.value(v, depth + 1) for v in value],
            }
        if cls is dict:
            return {"t": "dict", "v": [[self.value(k, depth + 1), self.value(v, depth + 1)] for k, v in value.items()]}
        if isinstance(value, torch.dtype):
            return {"t": "dtype", "v": dtype_name(value)}
        if isinstance(value, torch.device):
            return {"t": "device", "v": str(value)}
        if isinstance(value, _TORCH_ENUMS):
            return {"t": "torch", "v": str(value).replace("torch.", "")}
        if isinstance(value, ParentRef):
            label = value.label.label if isinstance(value.label, TensorLogEntry) else value.label
            return {"t": "parent", "v": label}
        if isinstance(value, TensorLogEntry):
            return {"t": "entry", "v": value.label}
        if cls is slice:
            return {"t": "slice", "v": [self.value(value.start), self.value(value.stop), self.value(value.step)]}
        if value is Ellipsis:
            return {"t": "ellipsis"}
        if cls is complex:
            return {"t": "complex", "v": [self.value(value.real), self.value(value.imag)]}
        if cls is bytes:
            return {"t": "bytes", "v": value.hex()}
        if isinstance(value, (int, float)) and not isinstance(value, bool):  # numpy scalars and such
            return self.value(int(value) if isinstance(value, int) else float(value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and cls.__module__.startswith("torchlens."):
            return {
                "t": "dataclass",
                "cls": f"{cls.__module__}.{cls.__qualname__}",
                "v": {f.name: self.value(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)},
            }
        if cls is Written:
            return value.data
        if isinstance(value, Unsaved):
            return {"t": "unsaved", "type": value.type_name, "repr": value.text}
        if callable(value) and not isinstance(value, type):
            return self.function(value)
        return self._unsaved(value)

    def function(self, func: Callable) -> Dict[str, Any]:
        name = function_name(func)
        if name is None:
            text = getattr(func, "__qualname__", None) or _clipped_repr(func)
            self.unsaved.append((self.where, f"function {text}"))
            return {"t": "func", "v": None, "repr": str(text)}
        return {"t": "func", "v": name}


class Decoder:
    """The inverse of ``Encoder``; ``where`` (the JSON file) is named in every error."""

    def __init__(self, store: TensorStore, tensors: List[Dict[str, Any]], where: str) -> None:
        self.store = store
        self.tensors = tensors
        self.where = where
        self._decoded: Dict[int, torch.Tensor] = {}

    def tensor(self, number: int) -> torch.Tensor:
        found = self._decoded.get(number)
        if found is None:
            if not isinstance(number, int) or not 0 <= number < len(self.tensors):
                raise HistoryFileError(self.where, f"refers to tensor #{number}, which the index does not list")
            record = self.tensors[number]
            found = decode_tensor(record, self.store, number, self.where)
            if record.get("parameter"):
                try:
                    found = torch.nn.Parameter(found, requires_grad=record.get("requires_grad", True))
                except RuntimeError as error:  # an integer tensor cannot require gradients
                    raise HistoryFileError(self.where, f"tensor #{number} cannot be a parameter ({error})") from None
            self._decoded[number] = found
        return found

    def value(self, data: Any, depth: int = 0) -> Any:
        """The value ``data`` (JSON) stands for; anything malformed is a ``HistoryFileError``."""
        if depth > _MAX_DEPTH:  # the encoder stops at 40 levels; deeper means a damaged file
            raise HistoryFileError(self.where, f"a value nested more than {_MAX_DEPTH} levels deep")
        if data is None or isinstance(data, (bool, int, float, str)):
            return data
        if isinstance(data, list):
            return [self.value(v, depth + 1) for v in data]
        if not isinstance(data, dict) or "t" not in data:
            raise HistoryFileError(self.where, f"malformed value {str(data)[:80]!r}")
        tag, v = data["t"], data.get("v")
        try:
            if tag == "tensor":
                return self.tensor(data["k"])
            if tag == "meta":
                return self._meta(data)
            if tag == "tuple":
                return tuple(self.value(x, depth + 1) for x in v)
            if tag == "size":
                return torch.Size(v)
            if tag == "namedtuple":  # a plain namedtuple of the same name and fields (no code from the file)
                import collections

                return collections.namedtuple(data["name"], data["fields"])(*(self.value(x, depth + 1) for x in v))
            if tag == "dict":
                return {_hashable(self.value(k, depth + 1)): self.value(x, depth + 1) for k, x in v}
            if tag == "float":
                return float(v)
            if tag == "dtype":
                return dtype_of(v, self.where)
            if tag == "device":
                return torch.device(v)
            if tag == "torch":
                # the module's own dict: getattr would run torch's lazy importer (torch._inductor...)
                found = vars(torch).get(v) if isinstance(v, str) else None
                if not isinstance(found, _TORCH_ENUMS):
                    raise HistoryFileError(self.where, f"unknown torch constant {v!r}")
                return found
            if tag == "parent":
                return ParentRef(v)
            if tag == "entry":
                return v  # references between entries are kept as labels
            if tag == "slice":
                return slice(*(self.value(x, depth + 1) for x in v))
            if tag == "ellipsis":
                return Ellipsis
            if tag == "complex":
                return complex(self.value(v[0], depth + 1), self.value(v[1], depth + 1))
            if tag == "bytes":
                return bytes.fromhex(v)
            if tag == "dataclass":
                return self._dataclass(data["cls"], v, depth)
            if tag == "unsaved":
                return Unsaved(str(data.get("type", "?"))[:_REPR_CHARS], str(data.get("repr", ""))[:_REPR_CHARS])
            if tag == "func":
                return self.function(data)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, OverflowError) as error:
            if isinstance(error, HistoryFileError):
                raise
            raise HistoryFileError(self.where, f"malformed {tag!r} value ({type(error).__name__}: {error})") from None
        raise HistoryFileError(self.where, f"unknown value tag {tag!r} (written by a newer torchlens?)")

    def _meta(self, data: Dict[str, Any]) -> torch.Tensor:
        """A tensor of the meta device (shape and dtype, no values: nothing is allocated)."""
        shape = data["shape"]
        if not isinstance(shape, list) or len(shape) > 64 or not all(type(n) is int and n >= 0 for n in shape):
            raise HistoryFileError(self.where, f"malformed shape of a meta tensor {str(shape)[:80]!r}")
        found = torch.empty(shape, dtype=dtype_of(data["dtype"], self.where), device="meta")
        if data.get("parameter"):
            return torch.nn.Parameter(found, requires_grad=bool(data.get("requires_grad")))
        return found.requires_grad_(bool(data.get("requires_grad")) and found.is_floating_point())

    def function(self, data: Dict[str, Any]) -> Any:
        name = data.get("v")
        if name is None:
            return UnavailableFunction("", str(data.get("repr", "?"))[:_REPR_CHARS])
        try:
            return replayable_function(name)  # checked now: a shared folder must not choose what runs
        except Refused as refused:
            return UnavailableFunction(str(name)[:_REPR_CHARS], str(name)[:_REPR_CHARS], reason=refused.reason)

    def _dataclass(self, name: str, fields: Dict[str, Any], depth: int) -> Any:
        try:
            cls = resolve_name(name) if isinstance(name, str) and name.startswith("torchlens.") else None
        except LookupError:
            cls = None
        # only torchlens's own record types, under their own name (never one reached through another module)
        if not (
            isinstance(cls, type)
            and dataclasses.is_dataclass(cls)
            and f"{cls.__module__}.{cls.__qualname__}" == name
            and isinstance(fields, dict)
        ):
            raise HistoryFileError(self.where, f"unknown record type {str(name)[:80]!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        if not set(fields) <= known:
            raise HistoryFileError(self.where, f"record type {name} has no fields {sorted(set(fields) - known)[:3]}")
        return cls(**{k: self.value(x, depth + 1) for k, x in fields.items()})


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


# ----- call stacks: code objects are stored as (file, function, line) plus source text -----------
SOURCE_CONTEXT = 10  # lines kept on each side of every call site


def encode_frames(
    codes: Dict[int, int], code_table: List[Dict[str, Any]], sources: Dict[str, Dict[int, str]], frames: tuple
) -> List[List[int]]:
    """``call_frames`` as ``[[code number, line, offset], ...]``, filling the code and source tables."""
    import linecache

    out = []
    for code, line, lasti in frames:
        number = codes.get(id(code))
        if number is None:
            number = codes[id(code)] = len(code_table)
            code_table.append(
                {
                    "file": code.co_filename,
                    "name": code.co_name,
                    "qualname": getattr(code, "co_qualname", code.co_name),
                    "firstlineno": code.co_firstlineno,
                }
            )
        lines = sources.setdefault(code.co_filename, {})
        if line is not None and line not in lines:
            for n in range(max(1, line - SOURCE_CONTEXT), line + SOURCE_CONTEXT + 1):
                if n not in lines:
                    lines[n] = (
                        getattr(code, "source", {}).get(n, "")
                        if isinstance(code, DetachedCode)
                        else linecache.getline(code.co_filename, n)
                    )
        out.append([number, line, lasti])
    return out


def decode_code_table(table: List[Dict[str, Any]], sources: Dict[str, Dict[str, str]]) -> List[DetachedCode]:
    by_file = {f: {int(n): text for n, text in lines.items()} for f, lines in sources.items()}
    return [
        DetachedCode(
            c["file"],
            c["name"],
            c.get("qualname", c["name"]),
            c.get("firstlineno", 0),
            source=by_file.setdefault(c["file"], {}),
        )
        for c in table
    ]


__all__ = [
    "Encoder",
    "Decoder",
    "Unsaved",
    "UnavailableFunction",
    "function_name",
    "resolve_function",
    "encode_frames",
    "decode_code_table",
    "Written",
]
