"""``torchlens.load``: a saved history back as a ``ModelHistory``; tensors are read lazily."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import torch

from ..history.model_history import ModelHistory
from ..records.func_call import FuncCallLocation
from ..records.tensor_log import TensorLogEntry
from .codec import Decoder, SavedCode, decode_code_table
from .errors import HistoryFileError
from .save import FORMAT, FORMAT_VERSION, INDEX_FILE
from .shards import TensorStore, dtype_of

_LAZY_FIELDS = ("activation", "gradient", "func_args", "func_kwargs", "rng_state")


class SavedCallLocation(FuncCallLocation):
    """A ``FuncCallLocation`` of a loaded history: its source is the text stored at save time."""

    __slots__ = ()

    def _line(self, number: int) -> str:
        return self.code.source.get(number, "") if isinstance(self.code, SavedCode) else super()._line(number)


def _lazy_field(name: str) -> property:
    slot = TensorLogEntry.__dict__[name]  # the slot of the base class holds the decoded value

    def get(self: "StoredTensorLogEntry") -> Any:
        pending = self._pending
        if pending and name in pending:
            try:
                value = self._decoder.value(pending[name])
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
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise HistoryFileError(
            path, "missing: this folder is not a saved torchlens history, or its save did not finish"
        ) from None
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
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
    """Open a history saved by ``ModelHistory.save`` (see ``torchlens.load``)."""
    from ..history.index import build_lookup

    folder = os.fspath(folder)
    document = read_index(folder)
    where = os.path.join(folder, INDEX_FILE)
    store = TensorStore(folder, document["files"])
    store.check_files()
    decoder = Decoder(store, document["tensors"], where)
    codes = decode_code_table(document["codes"], document["sources"])
    fields = document["entry_fields"]
    entries: List[TensorLogEntry] = []
    try:
        for row in document["entries"]:
            entries.append(_entry(dict(zip(fields, row)), decoder, codes))
        history = ModelHistory.__new__(ModelHistory)
        for name, data in document["history"].items():
            setattr(history, name, decoder.value(data))
    except (KeyError, TypeError, IndexError, ValueError) as error:
        if isinstance(error, HistoryFileError):
            raise
        raise HistoryFileError(where, f"truncated or corrupted: {type(error).__name__}: {error}") from None
    history.replace_entries(entries, build_lookup(entries, history.modules.passes))
    history.attach_store(store)
    return history


def _entry(values: Dict[str, Any], decoder: Decoder, codes: List[SavedCode]) -> TensorLogEntry:
    e = StoredTensorLogEntry(
        values["raw_index"], values["kind"], values["layer_type"], None, func_name=values["func_name"]
    )
    e._decoder = decoder
    pending = {}
    for name, data in values.items():
        if name in _LAZY_FIELDS:
            pending[name] = data
        elif name == "call_frames":
            e.call_frames = tuple((codes[c], line, lasti) for c, line, lasti in data)
        elif name in TensorLogEntry.__slots__:
            object.__setattr__(e, name, decoder.value(data))
    e._pending = pending
    return e


__all__ = ["load_history", "read_index", "StoredTensorLogEntry", "SavedCallLocation"]
