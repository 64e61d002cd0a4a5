"""``torchlens.load``: a saved history back as a ``ModelHistory``; tensors are read lazily."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import torch

from ..history.model_history import ModelHistory, ModuleInfo, PassStats
from ..records.func_call import DetachedCode, FuncCallLocation
from ..records.tensor_log import _CAPTURE_FIELDS, _DERIVED_FIELDS, TensorLogEntry
from .codec import Decoder, decode_code_table
from .errors import HistoryFileError
from .fields import (
    ENTRY_CHECKS,
    HISTORY_CHECKS,
    LAZY_CHECKS,
    LAZY_JSON_CHECKS,
    call_frames_ok,
    modules_ok,
    pass_stats_ok,
)
from .save import DERIVED_HISTORY, FORMAT, FORMAT_VERSION, INDEX_FILE
from .shards import TensorStore, check_record, dtype_of, inside_folder

_LAZY_FIELDS = ("activation", "gradient", "func_args", "func_kwargs", "rng_state")
# the structure of a history (layers, call stacks, source lines); tensors are in the shards
MAX_INDEX_BYTES = 1 << 30


class SavedCallLocation(FuncCallLocation):
    """A ``FuncCallLocation`` of a loaded history: its source is the text stored at save time."""

    __slots__ = ()

    def _line(self, number: int) -> str:
        return self.code.source.get(number, "") if isinstance(self.code, DetachedCode) else super()._line(number)


def _lazy_field(name: str) -> property:
    slot = TensorLogEntry.__dict__[name]  # the slot of the base class holds the decoded value

    def get(self: "StoredTensorLogEntry") -> Any:
        pending = self._pending
        if pending and name in pending:
            try:
                value = self._decoder.value(pending[name])
                if not LAZY_CHECKS[name](value):
                    raise HistoryFileError(
                        self._decoder.where, f"a {type(value).__name__}, which this field never holds"
                    )
            except HistoryFileError as error:  # name the layer and field, not only the shard's tensor id
                raise HistoryFileError(
                    error.path,
                    f"the {name} of layer {self.label} cannot be read: {error.problem}; the folder was changed "
                    "or damaged after it was saved (save the history again)",
                ) from None
            del pending[name]
            slot.__set__(self, value)
            return value
        return slot.__get__(self)

    def set(self: "StoredTensorLogEntry", value: Any) -> None:
        if self._pending:
            self._pending.pop(name, None)
        slot.__set__(self, value)

    return property(get, set, doc=f"``{name}``, read from the saved folder when first used.")


class StoredTensorLogEntry(TensorLogEntry):
    """A ``TensorLogEntry`` of a loaded history: activations, gradients and saved function
    arguments are read from disk (memory-mapped) only when used; their shapes and sizes are
    known without reading them."""

    __slots__ = ("_pending", "_decoder")
    _pending: Optional[Dict[str, Any]]
    _decoder: Decoder

    activation = _lazy_field("activation")
    gradient = _lazy_field("gradient")
    func_args = _lazy_field("func_args")
    func_kwargs = _lazy_field("func_kwargs")
    rng_state = _lazy_field("rng_state")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._pending = None  # before the base class sets every field to None
        super().__init__(*args, **kwargs)

    def _record(self, name: str) -> Optional[Dict[str, Any]]:
        """The tensor index record of a field not read yet, or None."""
        pending = self._pending
        data = pending.get(name) if pending else None
        if isinstance(data, dict) and data.get("t") == "tensor":
            tensors = self._decoder.tensors
            number = data.get("k")
            if isinstance(number, int) and 0 <= number < len(tensors):
                return tensors[number]
        return None

    def _pending_is_set(self, name: str) -> Optional[bool]:
        pending = self._pending
        if pending and name in pending:
            return pending[name] is not None
        return None

    @property
    def has_saved_activation(self) -> bool:
        known = self._pending_is_set("activation")
        return known if known is not None else self.activation is not None

    @property
    def saved_nbytes(self) -> int:
        record = self._record("activation")
        return _nbytes(record, self._decoder.where) if record is not None else super().saved_nbytes

    @property
    def has_gradient(self) -> bool:
        known = self._pending_is_set("gradient")
        return known if known is not None else self.gradient is not None

    @property
    def grad_shape(self):
        record = self._record("gradient")
        return torch.Size(_shape(record)) if record is not None else super().grad_shape

    @property
    def grad_dtype(self):
        record = self._record("gradient")
        return (
            dtype_of(record["dtype"], self._decoder.where)
            if record is not None and "dtype" in record
            else super().grad_dtype
        )

    @property
    def grad_nbytes(self) -> int:
        record = self._record("gradient")
        return _nbytes(record, self._decoder.where) if record is not None else super().grad_nbytes

    @property
    def func_call_stack(self) -> List[FuncCallLocation]:
        return [SavedCallLocation(code, line) for code, line, _ in self.call_frames]


def _shape(record: Dict[str, Any]) -> List[int]:
    return record["shape"] if record.get("kind") == "dense" else record.get("size", [])


def _nbytes(record: Dict[str, Any], where: str) -> int:
    if record.get("kind") != "dense":
        return 0
    numel = 1
    for n in record["shape"]:
        numel *= n
    return numel * torch.empty(0, dtype=dtype_of(record["dtype"], where)).element_size()


def read_index(folder: str) -> Dict[str, Any]:
    """The parsed ``torchlens.json`` of a saved folder, with its format checked."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise HistoryFileError(
                folder, "not a folder: a saved torchlens history is a folder (see ModelHistory.save)"
            )
        raise FileNotFoundError(f"{folder}: no such folder (a saved torchlens history is a folder)")
    path = os.path.join(folder, INDEX_FILE)
    if not os.path.lexists(path):
        raise HistoryFileError(
            path, "missing: this folder is not a saved torchlens history, or its save did not finish"
        )
    inside_folder(folder, INDEX_FILE)  # not a link to a file elsewhere
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_INDEX_BYTES:  # checked before reading: the read is bounded, not the file
                raise HistoryFileError(
                    path,
                    f"{size} bytes, more than any index torchlens writes ({MAX_INDEX_BYTES} bytes at most; the "
                    "tensors are in the shards): not a saved torchlens history, or a damaged one",
                )
            raw = f.read(size + 1)  # not MAX_INDEX_BYTES: a read of n bytes allocates n first
    except OSError as error:
        raise HistoryFileError(path, f"cannot be read ({error.strerror or error})") from None
    except MemoryError:
        raise HistoryFileError(path, f"too large to read into memory ({size} bytes)") from None
    try:
        document = json.loads(raw)
    except MemoryError:
        raise HistoryFileError(path, f"too large to parse in the memory available ({len(raw)} bytes)") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise HistoryFileError(path, f"truncated or corrupted: not valid JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise HistoryFileError(path, "not a torchlens history index (no 'format': 'torchlens.trace.history')")
    version = document.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise HistoryFileError(path, f"unknown format version {version!r}")
    if version > FORMAT_VERSION:
        raise HistoryFileError(
            path,
            f"written in format version {version} by torchlens {document.get('torchlens_version')}; this "
            f"torchlens reads versions up to {FORMAT_VERSION}: upgrade torchlens to load it",
        )
    for key, kind in (
        ("history", dict),
        ("entry_fields", list),
        ("entries", list),
        ("codes", list),
        ("sources", dict),
        ("tensors", list),
        ("files", dict),
    ):
        if not isinstance(document.get(key), kind):
            raise HistoryFileError(path, f"truncated or corrupted: '{key}' is missing or malformed")
    return document


def load_history(folder: str) -> ModelHistory:
    """Open a history saved by ``ModelHistory.save`` (see ``torchlens.load``).

    The folder is untrusted input: every file read is inside it, every field is checked
    (``fields.py``, ``shards.check_record``) and every function name is checked against what
    the tracer records (``allowlist.py``); anything else is a ``HistoryFileError`` naming the
    layer, never another exception or a call."""
    from ..history.index import build_lookup

    folder = os.fspath(folder)
    document = read_index(folder)
    where = os.path.join(folder, INDEX_FILE)
    store = TensorStore(folder, document["files"])
    store.check_files()
    decoder = Decoder(store, document["tensors"], where)
    codes = _code_table(document, where)
    fields = _entry_fields(document["entry_fields"], where)
    entries: List[TensorLogEntry] = []
    for number, row in enumerate(document["entries"]):
        if type(row) is not list or len(row) != len(fields):
            raise HistoryFileError(where, f"entry #{number} is truncated or corrupted (not one value per field)")
        values = dict(zip(fields, row))
        label = values.get("label")
        layer = f"layer {label}" if type(label) is str else f"entry #{number}"
        try:
            entries.append(_entry(values, decoder, codes, layer))
        except HistoryFileError as error:
            if error.path == where and not error.problem.startswith(layer):
                raise HistoryFileError(where, f"{layer}: {error.problem}") from None
            raise
        except (KeyError, TypeError, IndexError, ValueError, RuntimeError) as error:
            raise HistoryFileError(
                where, f"{layer}: truncated or corrupted ({type(error).__name__}: {error})"
            ) from None
    history = _history(document["history"], decoder, where)
    _check_references(entries, history, where)
    try:
        lookup = build_lookup(entries, history.modules.passes)
    except Exception as error:  # noqa: BLE001 - the checks above should leave nothing to fail here
        raise HistoryFileError(where, f"truncated or corrupted: {type(error).__name__}: {error}") from None
    history.replace_entries(entries, lookup)
    history.attach_store(store)
    return history


_REBUILT_FIELDS = ("module_passes", "lookup_keys")
_REQUIRED_FIELDS = ("raw_index", "func_name", "layer_type", "kind", "label", "layer_label", "short_label")


def _entry_fields(fields: List[Any], where: str) -> List[str]:
    known = set(_CAPTURE_FIELDS + _DERIVED_FIELDS)
    if not all(type(f) is str for f in fields) or len(set(fields)) != len(fields):
        raise HistoryFileError(where, "truncated or corrupted: 'entry_fields' is not a list of distinct names")
    unknown = [f for f in fields if f not in known]
    missing = [f for f in _REQUIRED_FIELDS if f not in fields]
    if missing:
        raise HistoryFileError(where, f"truncated or corrupted: 'entry_fields' lacks {', '.join(missing)}")
    if unknown:
        raise HistoryFileError(
            where, f"the layers have fields this torchlens does not know ({', '.join(unknown[:3])}): upgrade torchlens"
        )
    return fields


def _code_table(document: Dict[str, Any], where: str) -> List[DetachedCode]:
    table, sources = document["codes"], document["sources"]
    ok = all(
        type(c) is dict
        and type(c.get("file")) is str
        and type(c.get("name")) is str
        and type(c.get("qualname", "")) is str
        and type(c.get("firstlineno", 0)) is int
        for c in table
    ) and all(
        type(lines) is dict and all(type(n) is str and n.isdigit() and type(t) is str for n, t in lines.items())
        for lines in sources.values()
    )
    if not ok:
        raise HistoryFileError(
            where, "truncated or corrupted: the call-stack tables ('codes', 'sources') are malformed"
        )
    return decode_code_table(table, sources)


def _entry(values: Dict[str, Any], decoder: Decoder, codes: List[DetachedCode], layer: str) -> TensorLogEntry:
    for name in ("raw_index", "kind", "layer_type", "func_name"):
        if not ENTRY_CHECKS[name](values[name]):
            raise HistoryFileError(decoder.where, f"{layer}: malformed '{name}' {str(values[name])[:60]!r}")
    e = StoredTensorLogEntry(
        values["raw_index"], values["kind"], values["layer_type"], None, func_name=values["func_name"]
    )
    e._decoder = decoder
    pending: Dict[str, Any] = {}
    for name, data in values.items():
        if name in _LAZY_FIELDS:
            if not LAZY_JSON_CHECKS[name](data):
                raise HistoryFileError(decoder.where, f"{layer}: malformed '{name}' {str(data)[:60]!r}")
            _check_tensor_reference(data, decoder, f"{layer}: the {name}")
            pending[name] = data
        elif name in _REBUILT_FIELDS:
            continue  # build_lookup sets them again from the history's own modules and keys
        elif name == "call_frames":
            if not call_frames_ok(data, len(codes)):
                raise HistoryFileError(decoder.where, f"{layer}: malformed 'call_frames'")
            e.call_frames = tuple((codes[c], line, lasti) for c, line, lasti in data)
        else:
            value = decoder.value(data)
            check = ENTRY_CHECKS.get(name)
            if check is not None and not check(value):
                raise HistoryFileError(decoder.where, f"{layer}: malformed '{name}' {str(value)[:60]!r}")
            object.__setattr__(e, name, value)
    e._pending = pending
    return e


def _check_tensor_reference(data: Any, decoder: Decoder, what: str) -> None:
    """A field that is one tensor is checked now (its shape and size are read without the data)."""
    if isinstance(data, dict) and data.get("t") == "tensor":
        number = data.get("k")
        if type(number) is not int or not 0 <= number < len(decoder.tensors):
            raise HistoryFileError(decoder.where, f"{what} refers to tensor #{number}, which the index does not list")
        try:
            check_record(decoder.tensors[number], decoder.store.files, decoder.where)
        except HistoryFileError as error:
            raise HistoryFileError(error.path, f"{what}: {error.problem}") from None


def _history(attributes: Dict[str, Any], decoder: Decoder, where: str) -> ModelHistory:
    history = ModelHistory.__new__(ModelHistory)
    for name, data in attributes.items():
        # only plain attributes: never one of the class's methods or the entries rebuilt below
        if type(name) is not str or not name.isidentifier() or name.startswith("__") or hasattr(ModelHistory, name):
            raise HistoryFileError(where, f"history: unexpected attribute {str(name)[:60]!r}")
        if name in DERIVED_HISTORY:
            continue
        value = decoder.value(data)
        check = HISTORY_CHECKS.get(name)
        if check is not None and not check(value):
            raise HistoryFileError(where, f"history: malformed '{name}' {str(value)[:60]!r}")
        setattr(history, name, value)
    missing = [n for n in (*HISTORY_CHECKS, "modules", "pass_stats") if n not in vars(history)]
    if missing:
        raise HistoryFileError(where, f"history: truncated or corrupted: {', '.join(missing)} missing")
    if not isinstance(history.modules, ModuleInfo) or not modules_ok(history.modules):
        raise HistoryFileError(where, "history: malformed 'modules'")
    if not isinstance(history.pass_stats, PassStats) or not pass_stats_ok(history.pass_stats):
        raise HistoryFileError(where, "history: malformed 'pass_stats'")
    return history


def _check_references(entries: List[TensorLogEntry], history: ModelHistory, where: str) -> None:
    """Labels are distinct, every layer named by another is one of the pass, every module named
    is a module of the model."""
    labels = set()
    for e in entries:
        if e.label in labels:
            raise HistoryFileError(where, f"layer {e.label}: two layers carry this label")
        labels.add(e.label)
    modules = set(history.modules.types) | {""}
    known = labels | set(getattr(history, "_all_labels", ()))  # a layers_to_save subset names dropped layers
    for e in entries:
        named = list(e.parent_layers or ()) + list(e.child_layers or ()) + list(e.call_outputs or ())
        named += list(e.parent_arg_positions or ()) + ([e.branch_condition] if e.branch_condition else [])
        unknown = [n for n in named if n not in known]
        if unknown:
            raise HistoryFileError(
                where, f"layer {e.label}: refers to {unknown[0]}, which is not a layer of this history"
            )
        addresses = [a for a, _ in e.module_stack or ()] + [a for a, _ in e.output_of_modules or ()]
        addresses += [a for a, _ in (e.module_output_positions or {})]
        stray = [a for a in addresses if a not in modules]
        if stray:
            raise HistoryFileError(
                where, f"layer {e.label}: refers to module {stray[0]!r}, which the history does not list"
            )


__all__ = ["load_history", "read_index", "StoredTensorLogEntry", "SavedCallLocation"]
