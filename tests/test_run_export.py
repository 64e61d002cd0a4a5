"""run.export("run.parquet") as a long table readable without torchlens, and `torchlens runs`
(the listing, and SQL through DuckDB)."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.cli import main
from torchlens.train.store.export import RunExportError, RunExportExistsError
from torchlens.train.store.query import list_runs, query_runs, runs_main

pq = pytest.importorskip("pyarrow.parquet")


def _run(folder, steps=3, scale=1.0, log=("io", "params", "params_grad")):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    with tl.watch(model, run_dir=str(folder), backend=(), verbose=False, log=log, sample_n=None):
        for _ in range(steps):
            model(torch.rand(8, 3) * scale).sum().backward()
    return str(folder)


def test_a_run_exports_as_one_long_table(tmp_path):
    folder = _run(tmp_path / "run")
    with tl.open_run(folder) as run:
        path = run.export(tmp_path / "run.parquet")
        table = pq.read_table(path)
        names = run.series_names()
        assert table.num_rows == sum(len(run.series(*n).steps) for n in names)
        assert {"step", "call", "kind", "name", "count", "mean", "std", "bin_edges", "counts"} <= set(
            table.column_names
        )
        rows = table.to_pylist()
        s = run.series("0:1", "params", "weight")
        mine = [r for r in rows if (r["call"], r["kind"], r["name"]) == ("0:1", "params", "weight")]
        assert [r["step"] for r in mine] == s.steps.tolist() == [0, 1, 2]
        for i, r in enumerate(mine):
            assert r["mean"] == pytest.approx(s.mean[i]) and r["count"] == 12
            assert np.allclose(r["counts"], s.counts[i]) and np.allclose(r["bin_edges"], s.bin_edges[i])
            assert r["module"] == "0" and r["module_type"] == "Linear"
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(path)
    assert set(frame["kind"]) == {"io", "params", "params_grad"}
    duckdb = pytest.importorskip("duckdb")
    got = duckdb.sql(
        f"SELECT max(step), count(DISTINCT call) FROM read_parquet('{path}') WHERE kind = 'params_grad'"
    ).fetchall()
    assert got == [(2, 2)]  # the two Linear calls have parameters


def test_run_export_refuses_what_it_cannot_do(tmp_path):
    folder = _run(tmp_path / "run", steps=1)
    with tl.open_run(folder) as run:
        target = tmp_path / "t.parquet"
        target.write_text("mine")
        with pytest.raises(RunExportExistsError, match="overwrite=True"):
            run.export(target)
        assert target.read_text() == "mine"
        run.export(target, overwrite=True)
        assert pq.read_table(target).num_rows > 0
        with pytest.raises(RunExportError, match="known formats: parquet"):
            run.export(tmp_path / "t.csv", format="csv")
        with pytest.raises(RunExportError, match="format='parquet'"):
            run.export(tmp_path / "t.json")


def test_run_export_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    folder = _run(tmp_path / "run", steps=1)
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with tl.open_run(folder) as run, pytest.raises(RunExportError, match=r"torchlens\[parquet\]"):
        run.export(tmp_path / "run.parquet")
    assert not (tmp_path / "run.parquet").exists()


def test_torchlens_runs_lists_the_runs_of_a_folder(tmp_path, capsys):
    _run(tmp_path / "runs" / "a", steps=2)
    _run(tmp_path / "runs" / "b", steps=3, log=("params",))
    (tmp_path / "runs" / "not-a-run").mkdir()
    listing = list_runs(str(tmp_path / "runs"))
    assert [(r["run"], r["model"], r["steps"], r["status"]) for r in listing] == [
        ("a", "Sequential", 2, "finished"),
        ("b", "Sequential", 3, "finished"),
    ]
    assert listing[1]["series"] == 4 and all(r["bytes"] > 0 for r in listing)  # two Linear, weight and bias
    assert main(["runs", str(tmp_path / "runs")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "model", "steps", "series", "status", "size"]
    assert lines[2].split()[:5] == ["a", "Sequential", "2", str(listing[0]["series"]), "finished"]
    assert main(["runs", str(tmp_path / "nowhere")]) == 2


def test_torchlens_runs_sql_queries_the_runs_with_duckdb(tmp_path, capsys):
    pytest.importorskip("duckdb")
    _run(tmp_path / "runs" / "calm", steps=2)
    _run(tmp_path / "runs" / "loud", steps=2, scale=100.0)
    columns, rows = query_runs(
        str(tmp_path / "runs"),
        "SELECT run, max(std) AS spread FROM series WHERE call = '0:1' AND kind = 'io' AND name = 'input 0' "
        "GROUP BY run ORDER BY spread DESC",
    )
    assert columns == ["run", "spread"] and [r[0] for r in rows] == ["loud", "calm"]
    assert rows[0][1] > 50 * rows[1][1]
    _, rows = query_runs(str(tmp_path / "runs"), "SELECT run, steps FROM runs ORDER BY run")
    assert rows == [("calm", 2), ("loud", 2)]
    out = io.StringIO()
    assert runs_main([str(tmp_path / "runs"), "--sql", "SELECT count(DISTINCT run) AS n FROM series"], out=out) == 0
    assert out.getvalue().split() == ["n", "-", "2"]
    assert main(["runs", str(tmp_path / "runs"), "--sql", "SELECT nonsense FROM series"]) == 2
    assert "the query failed" in capsys.readouterr().err


def test_sql_without_duckdb_names_the_extra(tmp_path, monkeypatch, capsys):
    _run(tmp_path / "run", steps=1)
    monkeypatch.setitem(sys.modules, "duckdb", None)
    assert main(["runs", str(tmp_path / "run"), "--sql", "SELECT 1"]) == 2
    assert "torchlens[sql]" in capsys.readouterr().err
