"""``format="parquet"`` (or a ``.parquet`` path): the table of ``history.to_pandas()`` as a
Parquet file, one row per entry, with typed columns (shapes and label lists as lists), plus
the source line of each operation. DuckDB, pandas, Polars and Spark read it without
torchlens. Needs ``pyarrow`` (``pip install 'torchlens[parquet]'``).

Example:
    >>> import tempfile, torch, torchlens as tl
    >>> import pyarrow.parquet as pq
    >>> h = tl.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()), torch.ones(1, 3))
    >>> table = pq.read_table(h.export(tempfile.mkdtemp() + "/ops.parquet"))
    >>> table.column("label").to_pylist(), table.column("shape").to_pylist()[1]
    (['input_1_0', 'linear_1_1', 'relu_1_2', 'output_1_3'], [1, 2])
"""

from __future__ import annotations

from typing import Any, Dict, List

from ._graph import nodes_of
from ._target import require

_INT = (
    "type_index",
    "layer_index",
    "pass_num",
    "num_passes",
    "operation_num",
    "nbytes",
    "grad_nbytes",
    "num_params",
    "param_bytes",
)
_BOOL = ("has_saved_activation", "has_gradient", "is_inplace", "created_inside_model", "bool_used")
_INT_LISTS = ("shape", "grad_shape")
_STRING_LISTS = ("parent_layers", "child_layers", "param_addresses", "containing_modules", "modules_output_of")


def _type(pa: Any, column: str) -> Any:
    if column in _INT:
        return pa.int64()
    if column in _BOOL:
        return pa.bool_()
    if column == "elapsed":
        return pa.float64()
    if column in _INT_LISTS:
        return pa.list_(pa.int64())
    if column in _STRING_LISTS:
        return pa.list_(pa.string())
    return pa.string()


def _cell(value: Any, column: str) -> Any:
    if value is None:
        return None
    if column in _INT_LISTS:
        return [int(v) for v in value]
    if column in _STRING_LISTS:
        return [str(v) for v in value]
    if column in _INT:
        return int(value)
    if column in _BOOL:
        return bool(value)
    if column == "elapsed":
        return float(value)
    return str(value)


def ops_table(history: Any) -> Any:
    """The entries of ``history`` as a ``pyarrow.Table`` (the columns of ``to_pandas`` and
    ``source``/``code``, the line that made each operation)."""
    pa = require("pyarrow", "parquet", "a Parquet export")
    rows = [e.to_row() for e in history.layer_list]
    places = {n.label: (n.source, n.code) for n in nodes_of(history)}
    columns: List[str] = list(rows[0]) if rows else ["label"]
    data: Dict[str, List[Any]] = {c: [_cell(r.get(c), c) for r in rows] for c in columns}
    data["source"] = [places[r["label"]][0] or None for r in rows]
    data["code"] = [places[r["label"]][1] or None for r in rows]
    schema = pa.schema([(c, _type(pa, c)) for c in data])
    metadata = {b"torchlens.model": str(history.model_name).encode("utf-8")}
    return pa.Table.from_pydict(data, schema=schema.with_metadata(metadata))


def write_parquet(history: Any, path: str) -> None:
    pq = require("pyarrow.parquet", "parquet", "a Parquet export")
    pq.write_table(ops_table(history), path)
