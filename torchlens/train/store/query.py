"""``torchlens runs DIR``: the runs under a folder, a line each (name, model, logged steps,
series, status, size), and ``torchlens runs DIR --sql "SELECT ..."``: SQL over them through
DuckDB (``pip install 'torchlens[sql]'``), with two tables:

- ``runs``: one row per run (``run``, ``model``, ``steps``, ``series``, ``status``, ``bytes``,
  ``folder``);
- ``series``: every run's series as one long table (a ``run`` column, then the columns of
  ``run.export("run.parquet")``: call, module, kind, name, step, exact statistics, histogram).

Example:
    >>> import tempfile, torch, torchlens as tl
    >>> from torchlens.train.store.query import list_runs
    >>> root = tempfile.mkdtemp()
    >>> model = torch.nn.Linear(3, 2)
    >>> with tl.watch(model, run_dir=root + "/a", backend=(), verbose=False, log=("params",)):
    ...     model(torch.rand(4, 3)).sum().backward()
    >>> [(r["run"], r["steps"], r["series"], r["status"]) for r in list_runs(root)]
    [('a', 1, 2, 'finished')]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...errors import TorchlensError
from .export import run_table
from .reader import Run, RunError, find_runs


class RunQueryError(TorchlensError, ValueError):
    """A listing or query that cannot be answered (no such folder, no duckdb, bad SQL)."""


def _folder_bytes(folder: str) -> int:
    total = 0
    for name in os.listdir(folder):  # a run folder is flat: run.db, its WAL, TensorBoard files
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            total += os.path.getsize(path)
    return total


def list_runs(root: str) -> List[Dict[str, Any]]:
    """One dict per run under ``root`` (``root`` itself when it is a run), in name order: run
    (its folder relative to ``root``), model, steps, series, status, bytes, folder; a run that
    cannot be read has ``status`` ``'unreadable: ...'``."""
    if not os.path.isdir(root):
        raise RunQueryError(f"no such folder: {root}")
    rows = []
    for run_id in find_runs(root):
        folder = os.path.join(os.path.abspath(root), run_id)
        name = run_id if run_id != "." else os.path.basename(os.path.abspath(root))
        row: Dict[str, Any] = {"run": name, "model": None, "steps": None, "series": None, "status": None}
        try:
            with Run(folder) as run:
                row.update(
                    model=run.model_name, steps=len(run.steps), series=len(run.series_names()), status=run.status
                )
        except (RunError, OSError) as error:
            row["status"] = f"unreadable: {error}"
        row["bytes"] = _folder_bytes(folder)
        row["folder"] = folder
        rows.append(row)
    return rows


def _human(n: int) -> str:
    """``2048`` -> ``'2.0 KB'``."""
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _text_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in columns]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def query_runs(root: str, sql: str) -> Tuple[List[str], List[tuple]]:
    """Run ``sql`` (DuckDB's dialect) over the tables ``runs`` and ``series`` of the runs under
    ``root``; returns the column names and the rows."""
    try:
        duckdb = importlib.import_module("duckdb")
    except ImportError:
        raise RunQueryError(
            "--sql needs duckdb: pip install 'torchlens[sql]' (or pip install duckdb pyarrow)."
        ) from None
    import pyarrow as pa  # duckdb reads arrow tables in place

    listing = list_runs(root)
    runs = pa.Table.from_pylist(
        listing,
        schema=pa.schema(
            [
                ("run", pa.string()),
                ("model", pa.string()),
                ("steps", pa.int64()),
                ("series", pa.int64()),
                ("status", pa.string()),
                ("bytes", pa.int64()),
                ("folder", pa.string()),
            ]
        ),
    )
    tables = []
    for row in listing:
        if row["status"] is not None and row["status"].startswith("unreadable"):
            continue
        with Run(row["folder"]) as run:
            tables.append(run_table(run, run_name=row["run"]))
    series = pa.concat_tables(tables) if tables else run_table_empty(pa)
    db = duckdb.connect()
    try:
        db.register("runs", runs)
        db.register("series", series)
        try:
            result = db.execute(sql)
        except duckdb.Error as error:
            raise RunQueryError(f"the query failed: {error}") from None
        columns = [d[0] for d in result.description] if result.description else []
        return columns, result.fetchall()
    finally:
        db.close()


def run_table_empty(pa: Any) -> Any:
    """The ``series`` table with no rows (a folder without readable runs)."""
    fields = [("run", pa.string()), ("call", pa.string()), ("kind", pa.string()), ("name", pa.string())]
    return pa.table({name: pa.array([], type=t) for name, t in fields})


def runs_main(argv: Sequence[str], out: Optional[Any] = None) -> int:
    """``torchlens runs DIR [--sql QUERY]``: print the listing, or the query's result."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="torchlens runs",
        description="List the runs written by tl.watch under a folder, or query them with SQL (DuckDB).",
        epilog="tables: runs (run, model, steps, series, status, bytes, folder) and series (run, call, module, kind, "
        "name, step, count, min, max, mean, std, nan, ..., bin_edges, counts). Example: torchlens runs "
        "torchlens_runs/ --sql \"SELECT run, max(std) FROM series WHERE kind = 'params_grad' GROUP BY run\"",
    )
    parser.add_argument("root", help="a run folder or a folder holding runs")
    parser.add_argument("--sql", metavar="QUERY", help="a SQL query over the tables runs and series")
    args = parser.parse_args(argv)
    try:
        if args.sql:
            columns, rows = query_runs(args.root, args.sql)
            print(_text_table(columns, rows), file=out)
            return 0
        listing = list_runs(args.root)
        if not listing:
            print(f"torchlens: no runs under {args.root}", file=out)
            return 0
        rows = [(r["run"], r["model"], r["steps"], r["series"], r["status"], _human(r["bytes"])) for r in listing]
        print(_text_table(["run", "model", "steps", "series", "status", "size"], rows), file=out)
        return 0
    except RunQueryError as error:
        print(f"torchlens: error: {error}", file=sys.stderr)
        return 2


__all__ = ["list_runs", "query_runs", "runs_main", "RunQueryError"]
