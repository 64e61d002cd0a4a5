"""The step timeline of a watched run and its export for Perfetto (``format="chrome_trace"``)."""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
import torch

import torchlens as tl
from torchlens.train.store import read_timeline
from torchlens.train.store.chrome_trace import NO_TIMELINE
from torchlens.train.store.export import RunExportError, RunExportExistsError

STEPS = 4


def _train(folder: str, log_freq: int = 1, log: tuple = ("io", "io_grad", "params", "params_grad")) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tl.watch(model, run_dir=folder, backend=(), verbose=False, log_freq=log_freq, log=log):
        for _ in range(STEPS):
            opt.zero_grad()
            model(torch.rand(4, 8)).pow(2).mean().backward()
            opt.step()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = str(tmp_path_factory.mktemp("run") / "mlp")
    _train(folder, log=("io", "io_grad", "params", "params_grad", "updates"))
    return folder


def _trace(run_dir: str, tmp_path) -> dict:
    path = tl.open_run(run_dir).export(str(tmp_path / "steps.json"), format="chrome_trace")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_timeline_rows_of_every_logged_step(run_dir: str) -> None:
    rows = read_timeline(tl.open_run(run_dir))
    assert rows is not None
    for step in range(STEPS):
        phases = {r.phase for r in rows if r.step == step and r.thread == "training"}
        assert {"forward", "backward", "optimizer", "watch", "hooks"} <= phases, (step, phases)
        assert any(r.step == step and r.thread == "writer" and r.phase == "write" for r in rows)
    hooks = [r for r in rows if r.phase == "hooks"]
    assert all(0 < r.busy_ns <= r.end_ns - r.start_ns for r in hooks)  # a sum of time within its span
    assert all(r.end_ns >= r.start_ns >= 0 for r in rows)


def test_chrome_trace_structure(run_dir: str, tmp_path) -> None:
    trace = _trace(run_dir, tmp_path)
    events = trace["traceEvents"]
    assert isinstance(events, list)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {os.path.basename(run_dir)}
    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:
        assert {"name", "ts", "dur", "pid", "tid", "cat"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0
    training = [e for e in slices if e["tid"] == 1]
    steps = [e for e in training if e["cat"] == "step"]
    assert [e["args"]["step"] for e in steps] == list(range(STEPS))
    for a, b in zip(steps, steps[1:]):
        assert a["ts"] + a["dur"] <= b["ts"]  # steps one after another
    for head in steps:
        step = head["args"]["step"]
        inside = [e for e in training if e["cat"] != "step" and e["args"]["step"] == step]
        for e in inside:  # nested within the step
            assert head["ts"] <= e["ts"] and e["ts"] + e["dur"] <= head["ts"] + head["dur"] + 1e-3
        first = {}
        for e in inside:
            first.setdefault(e["name"], e["ts"])
        assert first["forward"] <= first["backward"] <= first["optimizer"]
        forward = next(e for e in inside if e["name"] == "forward")
        backward = next(e for e in inside if e["name"] == "backward")
        assert forward["ts"] + forward["dur"] <= backward["ts"]
    writes = [e for e in slices if e["tid"] == 2]
    assert writes and all(e["name"] == "write" for e in writes)
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == STEPS and all(c["args"]["hooks"] > 0 for c in counters)
    assert "note" not in trace["otherData"]


def test_slices_on_a_track_nest(run_dir: str, tmp_path) -> None:
    """Perfetto draws slices of one track as a stack: any two either nest or do not overlap."""
    slices = [e for e in _trace(run_dir, tmp_path)["traceEvents"] if e["ph"] == "X"]
    for tid in (1, 2):
        spans = sorted(((e["ts"], e["ts"] + e["dur"]) for e in slices if e["tid"] == tid), key=lambda s: (s[0], -s[1]))
        stack: list = []
        for start, end in spans:
            while stack and stack[-1] <= start + 1e-3:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, (start, end, stack)
            stack.append(end)


def test_log_freq_records_only_logged_steps(tmp_path) -> None:
    folder = str(tmp_path / "run")
    _train(folder, log_freq=2, log=("params",))
    rows = read_timeline(tl.open_run(folder))
    assert rows is not None and {r.step for r in rows} == {0, 2}


def test_old_run_without_timeline_exports_a_note(tmp_path) -> None:
    folder = str(tmp_path / "old")
    _train(folder, log=("params",))
    db = sqlite3.connect(os.path.join(folder, "run.db"))
    db.execute("DROP TABLE timeline")  # as a run written before the table existed
    db.commit()
    db.close()
    run = tl.open_run(folder)
    assert read_timeline(run) is None
    trace = _trace(folder, tmp_path)
    assert trace["otherData"]["note"] == NO_TIMELINE
    assert not [e for e in trace["traceEvents"] if e["ph"] in ("X", "C")]
    assert len(run.steps) == STEPS  # the rest of the run reads as before


def test_existing_file_and_unknown_format(run_dir: str, tmp_path) -> None:
    run = tl.open_run(run_dir)
    path = str(tmp_path / "steps.json")
    run.export(path, format="chrome_trace")
    with pytest.raises(RunExportExistsError, match="overwrite=True"):
        run.export(path, format="chrome_trace")
    assert run.export(path, format="chrome_trace", overwrite=True) == path
    with pytest.raises(RunExportError, match="parquet, chrome_trace"):
        run.export(str(tmp_path / "x.json"), format="perfetto")
    with pytest.raises(RunExportError, match="chrome_trace"):
        run.export(str(tmp_path / "x.json"))  # a .json path does not name a format
    assert sorted(os.listdir(tmp_path)) == ["steps.json"]  # nothing half-written
