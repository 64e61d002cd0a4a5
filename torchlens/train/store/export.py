"""``run.export("run.parquet")``: a run's series as one long table that DuckDB, pandas, Polars
and Spark read without torchlens: one row per (series, column of its heat strip), with the
call, the kind and name of the tensor, the steps the column holds, the statistics over all
values (``count``, ``min``, ``max``, ``mean``, ``std``, ``nan``, ``posinf``, ``neginf``,
``zeros``, ``line``), and the histogram (``hist_min``/``hist_max``, ``bin_edges``, ``counts``).
Needs ``pyarrow`` (``pip install 'torchlens[parquet]'``). ``format="chrome_trace"`` writes the
run's step timeline for Perfetto instead (``run_trace``).

Example:
    >>> import tempfile, torch, torchlens as tl
    >>> import pyarrow.parquet as pq
    >>> model, folder = torch.nn.Linear(3, 2), tempfile.mkdtemp()
    >>> with tl.watch(model, run_dir=folder, backend=(), verbose=False, log=("params",)):
    ...     for _ in range(2):
    ...         model(torch.rand(4, 3)).sum().backward()
    >>> table = pq.read_table(tl.open_run(folder).export(folder + "/run.parquet"))
    >>> sorted(set(zip(table.column("name").to_pylist(), table.column("step").to_pylist())))
    [('bias', 0), ('bias', 1), ('weight', 0), ('weight', 1)]
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Dict, List, Optional

from ...errors import TorchlensError
from ...files import write_atomically

# the exact statistics as columns of the table: (column, Series attribute)
_STATS = (
    ("count", "count"),
    ("min", "true_min"),
    ("max", "true_max"),
    ("mean", "mean"),
    ("std", "std"),
    ("nan", "nan"),
    ("posinf", "posinf"),
    ("neginf", "neginf"),
    ("zeros", "zeros"),
    ("line", "line"),
)
FORMATS = ("parquet", "chrome_trace")


class RunExportError(TorchlensError, ValueError):
    """A run export that cannot be made as asked (unknown format, no pyarrow, a folder as target)."""


class RunExportExistsError(TorchlensError, FileExistsError):
    """The export's target file exists; ``overwrite=True`` replaces it."""


def _pyarrow() -> Any:
    try:
        return importlib.import_module("pyarrow")
    except ImportError:
        raise RunExportError(
            "exporting a run to Parquet needs pyarrow: pip install 'torchlens[parquet]' (or pip install pyarrow)."
        ) from None


def _finite(value: float) -> Optional[float]:
    return None if value != value else float(value)  # NaN: a missing value, as every reader expects


def run_table(run: Any, run_name: Optional[str] = None) -> Any:
    """The series of ``run`` as a ``pyarrow.Table`` (the long table described above); a ``run``
    column holds ``run_name`` when given (tables of several runs stacked)."""
    pa = _pyarrow()
    calls = run.calls
    columns: Dict[str, List[Any]] = {
        name: []
        for name in (
            ["call", "module", "module_type", "kind", "name", "step", "last_step", "num_steps"]
            + [c for c, _ in _STATS]
            + ["line_label", "hist_min", "hist_max", "nonfinite", "bin_edges", "counts"]
        )
    }
    for call_id, kind, name in run.series_names():
        s = run.series(call_id, kind, name)
        call = calls.get(call_id)
        for i in range(len(s.steps)):
            columns["call"].append(call_id)
            columns["module"].append(call.address if call is not None else call_id.rsplit(":", 1)[0])
            columns["module_type"].append(call.class_name if call is not None else None)
            columns["kind"].append(kind)
            columns["name"].append(name)
            columns["step"].append(int(s.steps[i]))
            columns["last_step"].append(int(s.last_steps[i]))
            columns["num_steps"].append(int(s.num_steps[i]))
            for column, attribute in _STATS:
                values = getattr(s, attribute)
                columns[column].append(_finite(values[i]) if len(values) > i else None)
            columns["line_label"].append(s.line_label)
            columns["hist_min"].append(_finite(s.min[i]))
            columns["hist_max"].append(_finite(s.max[i]))
            columns["nonfinite"].append(int(s.nonfinite[i]))
            columns["bin_edges"].append([float(x) for x in s.bin_edges[i]])
            columns["counts"].append([float(x) for x in s.counts[i]])
    types = {
        "step": pa.int64(),
        "last_step": pa.int64(),
        "num_steps": pa.int64(),
        "nonfinite": pa.int64(),
        "bin_edges": pa.list_(pa.float64()),
        "counts": pa.list_(pa.float32()),
    }
    for column, _ in _STATS:
        types[column] = pa.float64()
    types["hist_min"] = types["hist_max"] = pa.float64()
    fields = [(c, types.get(c, pa.string())) for c in columns]
    if run_name is not None:
        columns = {"run": [run_name] * len(columns["call"]), **columns}
        fields = [("run", pa.string())] + fields
    metadata = {b"torchlens.model": str(run.model_name).encode("utf-8"), b"torchlens.bins": str(run.bins).encode()}
    return pa.Table.from_pydict(columns, schema=pa.schema(fields, metadata=metadata))


def export_run(run: Any, path: str, format: Optional[str] = None, overwrite: bool = False) -> str:
    """Write the long table of ``run`` to ``path`` (see the module doc), or its step timeline
    with ``format="chrome_trace"``; returns ``path``."""
    path = os.fspath(path)
    fmt = format or ("parquet" if os.path.splitext(path)[1].lower() in (".parquet", ".pq") else None)
    if fmt not in FORMATS:
        raise RunExportError(
            f"unknown run export format {fmt!r}; known formats: {', '.join(FORMATS)} (a .parquet path names it)."
            if fmt is not None
            else f"cannot tell the export format from {os.path.basename(path)!r}; pass format='parquet' "
            "(the series as a table) or format='chrome_trace' (the step timeline)."
        )
    if os.path.isdir(path):
        raise RunExportError(f"{path} is a folder; export writes one file: give a file name.")
    if os.path.exists(path) and not overwrite:
        raise RunExportExistsError(f"{path} exists; pass overwrite=True to replace it.")
    if fmt == "chrome_trace":
        from .chrome_trace import write_run_trace

        return write_atomically(path, lambda staging: write_run_trace(run, staging))
    _pyarrow()  # the message that names the extra, before anything is written
    pq = importlib.import_module("pyarrow.parquet")
    table = run_table(run)
    return write_atomically(path, lambda staging: pq.write_table(table, staging))


__all__ = ["export_run", "run_table", "RunExportError", "RunExportExistsError", "FORMATS"]
