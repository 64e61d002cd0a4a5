"""``run.export("steps.json", format="chrome_trace")``: the step timeline of a watched run
(``torchlens/train/step/timeline.py`` records it) as a trace for Perfetto (ui.perfetto.dev) and ``chrome://tracing``, the Trace
Event Format's JSON object.

The process is the run (named by its folder). Track 1 is the training thread: a ``step N``
slice per logged step holding its ``forward``, ``backward`` and ``optimizer`` slices and the
watch's own work as ``watch`` slices (args: ``step``); the counter ``watch work (ms)`` gives,
per step, the time of those slices and of the recorder's hooks inside the model (a sum: they
run between the model's own operations). Track 2 is the watch's writer thread: a ``write``
slice for each write of a step (binning its samples and the database transaction). Times are
microseconds from the run's start. A run written before torchlens recorded timelines gives a
trace with no slices and a note in ``otherData``.

Example:
    >>> import json, pathlib, tempfile, torch, torchlens as tl
    >>> model, folder = torch.nn.Linear(3, 2), tempfile.mkdtemp()
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with tl.watch(model, run_dir=folder, backend=(), verbose=False):
    ...     for _ in range(2):
    ...         model(torch.rand(4, 3)).sum().backward()
    ...         opt.step()
    >>> path = tl.open_run(folder).export(folder + "/steps.json", format="chrome_trace")
    >>> events = json.loads(pathlib.Path(path).read_text())["traceEvents"]
    >>> [e["name"] for e in events if e["ph"] == "X" and e["cat"] in ("step", "phase")]
    ['step 0', 'forward', 'backward', 'optimizer', 'step 1', 'forward', 'backward', 'optimizer']
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

from .database import TimelineRow

PID = 1
TRAINING, WRITER = 1, 2
NO_TIMELINE = "no step timeline: this run was written before torchlens recorded one (its histograms are there)"
NO_STEPS = "no logged step has a timeline yet"
_CATEGORY = {"forward": "phase", "backward": "phase", "optimizer": "phase", "watch": "watch", "write": "watch"}


def read_timeline(run: Any) -> Optional[List[TimelineRow]]:
    """The timeline rows of a run (a ``tl.open_run`` object), by step and start; None for a
    run written before torchlens recorded timelines (it has no such table)."""
    found = run._query("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'timeline'")
    if not found:
        return None
    rows = run._query(
        "SELECT step, thread, phase, start_ns, end_ns, busy_ns FROM timeline ORDER BY step, start_ns, end_ns DESC"
    )
    with run._damaged("the step timeline"):
        return [
            TimelineRow(
                int(s), str(t), str(p), start_ns=int(a), end_ns=int(b), busy_ns=None if busy is None else int(busy)
            )
            for s, t, p, a, b, busy in rows
        ]


def _us(ns: int) -> float:
    return ns / 1000.0  # the format's unit


def _slice(name: str, cat: str, span: Tuple[int, int], tid: int) -> Dict[str, Any]:
    start, end = span
    return {"name": name, "cat": cat, "ph": "X", "ts": _us(start), "dur": _us(end - start), "pid": PID, "tid": tid}


def _step_events(step: int, rows: List[TimelineRow]) -> List[Dict[str, Any]]:
    """The slices of one logged step (training and writer threads) and its watch counter."""
    training = [r for r in rows if r.thread == "training" and r.phase != "hooks"]
    hooks = sum(r.busy_ns or 0 for r in rows if r.phase == "hooks")
    own = sum(r.end_ns - r.start_ns for r in training if r.phase == "watch")
    events: List[Dict[str, Any]] = []
    if training:
        start, end = min(r.start_ns for r in training), max(r.end_ns for r in training)
        head = _slice(f"step {step}", "step", (start, end), TRAINING)
        head["args"] = {"step": step, "watch_ms": own / 1e6, "hooks_ms": hooks / 1e6}
        events.append(head)
        counter = {"name": "watch work (ms)", "cat": "watch", "ph": "C", "ts": _us(start), "pid": PID}
        counter["args"] = {"slices": own / 1e6, "hooks": hooks / 1e6}
        events.append(counter)
    for r in rows:
        if r.phase == "hooks":
            continue
        tid = WRITER if r.thread == "writer" else TRAINING
        event = _slice(r.phase, _CATEGORY.get(r.phase, "phase"), (r.start_ns, r.end_ns), tid)
        event["args"] = {"step": step}
        events.append(event)
    return events


def trace_events(run: Any) -> Dict[str, Any]:
    """The step timeline of ``run`` (a ``tl.open_run`` object) as the Trace Event Format's JSON
    object (a dict)."""
    name = os.path.basename(run.run_dir)
    rows = read_timeline(run)
    events: List[Dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": PID, "tid": 0, "args": {"name": name}}]
    for tid, thread in ((TRAINING, "training thread"), (WRITER, "torchlens step writer")):
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": thread}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
    by_step: Dict[int, List[TimelineRow]] = {}
    for r in rows or ():
        by_step.setdefault(r.step, []).append(r)
    timed: List[Dict[str, Any]] = []
    for step in sorted(by_step):
        timed += _step_events(step, by_step[step])
    # a parent before its children when they start together: the step, then longer slices first
    timed.sort(key=lambda e: (e["ts"], e["cat"] != "step", -e.get("dur", 0)))
    other: Dict[str, Any] = {"producer": "torchlens", "run": name, "model": run.model_name, "steps": len(by_step)}
    if rows is None or not by_step:
        other["note"] = NO_TIMELINE if rows is None else NO_STEPS
    return {"traceEvents": events + timed, "displayTimeUnit": "ms", "otherData": other}


def write_run_trace(run: Any, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace_events(run), f)


__all__ = ["read_timeline", "trace_events", "write_run_trace", "NO_TIMELINE", "NO_STEPS"]
