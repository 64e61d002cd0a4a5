"""``ModelHistory.save``: a history as a folder of JSON (structure) and safetensors (tensors)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import warnings
from typing import Any, Dict, List, Optional

import torch

from ...arguments import PathExistsError
from ...version import __version__
from ..records.tensor_log import _CAPTURE_FIELDS, _DERIVED_FIELDS
from .codec import Encoder, encode_frames
from .shards import ShardWriter
from .unfinished import make_staging, mark_finished, remove_abandoned_staging

FORMAT = "torchlens.trace.history"
FORMAT_VERSION = 1
INDEX_FILE = "torchlens.json"
# history attributes rebuilt on load rather than stored
DERIVED_HISTORY = ("layer_list", "_index", "_rolled", "_store", "traced_here")
ENTRY_FIELDS = tuple(f for f in _CAPTURE_FIELDS + _DERIVED_FIELDS if f != "branch_condition_record")


class UnsavedValuesWarning(UserWarning):
    """Some values of a history could not be stored as they are (see the message): they are
    kept as ``Unsaved`` placeholders (type and ``repr``) in the saved folder."""


def save_history(history: Any, path: str, overwrite: bool = False) -> str:
    """Write ``history`` to the folder ``path`` (see ``ModelHistory.save``); returns the path."""
    path = os.fspath(path)
    if os.path.exists(path):
        if not overwrite:
            raise PathExistsError(
                f"{path} exists; pass overwrite=True to replace it (only a saved history or an "
                "empty folder is replaced)."
            )
        if not os.path.isdir(path) or (os.listdir(path) and not os.path.exists(os.path.join(path, INDEX_FILE))):
            raise PathExistsError(f"{path} is not a saved torchlens history; it is not replaced.")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    # write next to the target, then move into place: a failed save leaves no half-written history
    remove_abandoned_staging(parent)  # those of saves killed before they finished
    staging = make_staging(parent)
    try:
        writer = ShardWriter(staging)
        try:
            encoder = Encoder(writer)
            document = encode_history(history, encoder)
            writer.close()
        except BaseException:
            writer.abort()
            raise
        write_index(staging, document, writer, encoder)
        mark_finished(staging)
        if os.path.exists(path):
            old = path + ".torchlens-old"
            os.replace(path, old)
            os.replace(staging, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return path


def encode_history(history: Any, encoder: Encoder, activations: Optional[Dict[int, Any]] = None) -> Dict[str, Any]:
    """The JSON document of ``history`` (tensors go to ``encoder.writer``). ``activations``:
    entries' activations already written (``save_to``), by ``raw_index``."""
    codes: Dict[int, int] = {}
    code_table: List[Dict[str, Any]] = []
    sources: Dict[str, Dict[int, str]] = {}
    rows = []
    for entry in history.layer_list:
        row = []
        for field in ENTRY_FIELDS:
            encoder.where = f"{entry.label}.{field}"
            value = getattr(entry, field)
            if field == "call_frames":
                row.append(encode_frames(codes, code_table, sources, value or ()))
            elif field == "activation" and activations is not None and entry.raw_index in activations:
                row.append(activations[entry.raw_index])
            else:
                row.append(encoder.value(value))
        rows.append(row)
    attributes = {}
    for name, value in vars(history).items():
        if name not in DERIVED_HISTORY:
            encoder.where = f"history.{name}"
            attributes[name] = encoder.value(value)
    if encoder.unsaved:
        notes = attributes.get("notes") or []
        attributes["notes"] = notes + [_unsaved_note(encoder.unsaved)]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "torchlens_version": _version(),
        "torch_version": torch.__version__,
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "history": attributes,
        "entry_fields": list(ENTRY_FIELDS),
        "entries": rows,
        "codes": code_table,
        "sources": {f: {str(n): t for n, t in lines.items() if t} for f, lines in sources.items()},
    }


def write_index(folder: str, document: Dict[str, Any], writer: ShardWriter, encoder: Encoder) -> None:
    """Finish a saved folder: the tensor index and the file sizes go into ``torchlens.json``,
    written last (a folder without it is not a history); unsaved values are reported."""
    document["tensors"] = encoder.tensors
    document["files"] = dict(writer.files)
    document["unsaved"] = [list(u) for u in encoder.unsaved]
    target = os.path.join(folder, INDEX_FILE)
    with open(target + ".part", "w", encoding="utf-8") as f:
        json.dump(document, f, separators=(",", ":"), allow_nan=False)
    os.replace(target + ".part", target)
    if encoder.unsaved:
        warnings.warn(_unsaved_note(encoder.unsaved) + f" (saved in {folder})", UnsavedValuesWarning, stacklevel=3)


def _unsaved_note(unsaved: List[Any]) -> str:
    shown = "; ".join(f"{where}: {what}" for where, what in unsaved[:8]) + ("; ..." if len(unsaved) > 8 else "")
    return (
        f"{len(unsaved)} values could not be saved as they are and were stored as placeholders (their type and "
        f"repr; rerun() cannot use them): {shown}"
    )


def _version() -> str:
    return __version__
