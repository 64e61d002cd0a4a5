"""``history.export(path, format=...)``: a history in the formats other tools read.

=================  ==========================================================  ===============
format             what opens it                                               needs
=================  ==========================================================  ===============
``netron``         Netron (ONNX's JSON form; a binary model for ``.onnx``)     ``onnx`` for .onnx
``model_explorer`` Google's Model Explorer (its JSON graph, modules as boxes)  -
``chrome_trace``   Perfetto, ``chrome://tracing`` (a slice per operation)      -
``parquet``        DuckDB, pandas, Polars, Spark (one row per entry)           ``pyarrow``
=================  ==========================================================  ===============

A ``.onnx`` or ``.parquet`` path names its format; other paths need ``format=``. An existing
file is replaced only with ``overwrite=True``; the file appears whole or not at all.

Example:
    >>> import tempfile, torch, torchlens as tl
    >>> h = tl.log_forward_pass(torch.nn.Linear(3, 2), torch.ones(1, 3))
    >>> h.export(tempfile.mkdtemp() + "/trace.json", format="chrome_trace").endswith("trace.json")
    True
"""

from __future__ import annotations

from typing import Any, Optional

from ...files import write_atomically
from ..history.extensions import provide
from ._target import ExportError, ExportExistsError, MissingPackageError, check_target, pick_format
from .chrome_trace import trace_events, write_chrome_trace
from .model_explorer import explorer_json, write_model_explorer
from .netron import onnx_json, write_netron
from .parquet import ops_table, write_parquet

FORMATS = ("netron", "model_explorer", "chrome_trace", "parquet")


def export_history(
    history: Any, path: str, format: Optional[str] = None, overwrite: bool = False, weights: Any = None
) -> str:
    """Write ``history`` to ``path`` in ``format`` (see the module's table); returns ``path``.
    ``weights``: with ``format="netron"``, the traced model, whose parameter values are then
    stored (otherwise parameters appear by shape only)."""
    path = check_target(path, overwrite)
    fmt = pick_format(path, format, FORMATS)
    if weights is not None and fmt != "netron":
        raise ExportError(f"weights= goes with format='netron' (a graph with parameter values), not {fmt!r}.")
    if not history.layer_list:
        raise ExportError("this history has no entries to export.")
    if fmt == "netron":
        write = lambda tmp: write_netron(history, tmp, weights=weights, binary=path.lower().endswith(".onnx"))  # noqa: E731
    elif fmt == "model_explorer":
        write = lambda tmp: write_model_explorer(history, tmp)  # noqa: E731
    elif fmt == "chrome_trace":
        write = lambda tmp: write_chrome_trace(history, tmp)  # noqa: E731
    else:
        write = lambda tmp: write_parquet(history, tmp)  # noqa: E731
    return write_atomically(path, write)


provide("export", export_history)

__all__ = [
    "FORMATS",
    "export_history",
    "onnx_json",
    "explorer_json",
    "trace_events",
    "ops_table",
    "ExportError",
    "ExportExistsError",
    "MissingPackageError",
]
