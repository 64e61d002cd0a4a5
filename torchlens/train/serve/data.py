"""What the page shows, as JSON-ready values: the runs under a folder, a run's summary, the
layout of one call's graph, and the histograms of one call. The server and the exported file
both take their data from here, through the run reader only."""

from __future__ import annotations

import math
import os
import re
import threading
from typing import Any, Dict, List, Optional, Tuple

from ...errors import TorchlensError
from ..store import EXACT_COLUMNS, Run, RunError, find_runs
from .layout import layout


class NotFound(TorchlensError, LookupError):
    """A run or call that does not exist (404)."""


def _clean(values) -> list:
    return [None if v is None or not math.isfinite(v) else float(v) for v in values]


class Catalog:
    """The runs under ``root``: ``root`` itself when it is a run, else every run folder below it
    (to three levels). Run ids are paths relative to ``root`` (``'.'`` for the root itself); only
    discovered ids are ever opened, so a request cannot name another file."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self._runs: Dict[str, Run] = {}
        self._layouts: Dict[Tuple[str, str, int], dict] = {}
        self._lock = threading.Lock()
        self._prefetch_lock = threading.Lock()
        self._in_flight: Dict[Tuple[str, str, int], threading.Lock] = {}

    def run_ids(self) -> List[str]:
        return find_runs(self.root)

    def run(self, run_id: Optional[str]) -> Run:
        ids = self.run_ids()
        if run_id in (None, "") and len(ids) == 1:
            run_id = ids[0]
        if run_id not in ids:
            raise NotFound(f"no run {run_id!r} in the served folder")
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                run = Run(os.path.join(self.root, run_id))
                self._runs[run_id] = run
        return run

    def close(self) -> None:
        with self._lock:
            for run in self._runs.values():
                run.close()
            self._runs.clear()

    # ----- JSON ---------------------------------------------------------------------------
    def runs_json(self) -> dict:
        runs = []
        for run_id in self.run_ids():
            entry: Dict[str, Any] = {
                "id": run_id,
                "name": os.path.basename(os.path.join(self.root, run_id).rstrip("/.")) or os.path.basename(self.root),
            }
            try:
                run = self.run(run_id)
                entry.update(model=run.model_name, status=run.status, steps=len(run.steps))
            except (RunError, OSError) as error:
                entry.update(error=str(error).replace(self.root + os.sep, ""))
            runs.append(entry)
        return {"runs": runs}  # ids are relative to the served folder: its absolute path stays here

    def summary_json(self, run_id: Optional[str]) -> dict:
        run = self.run(run_id)
        calls = run.calls
        series: Dict[str, list] = {}
        for cid, kind, name in run.series_names():
            series.setdefault(cid, []).append([kind, name])
        return {
            "model": run.model_name,
            "status": run.status,
            "stride": run.stride,
            "bins": run.bins,
            "steps": run.steps.tolist(),
            "calls": {cid: c.to_dict() for cid, c in calls.items()},
            "series": series,
            "options": run.options,
        }

    def poll_json(self, run_id: Optional[str], since: int) -> dict:
        """What changed after step ``since``: new steps, the stride, the number of calls."""
        run = self.run(run_id)  # polled every few seconds by every open page: read only what is new
        num_steps, last_step = run.step_count  # the page's count: the server's, not a sum of answers
        return {
            "steps": run.steps_after(since).tolist(),
            "num_steps": num_steps,
            "last_step": last_step,
            "stride": run.stride,
            "status": run.status,
            "num_calls": run.num_calls,
        }

    def layout_json(self, run_id: Optional[str], call_id: str) -> dict:
        run = self.run(run_id)
        calls = run.calls
        if call_id not in calls:
            raise NotFound(f"no call {call_id!r} in this run")
        cached = self._layout(run_id, calls, call_id)
        # the user is likely to open one of these next: lay them out while they look
        inner = [c for c in calls[call_id].children if calls[c].children]
        if inner:
            threading.Thread(target=self._prefetch, args=(run_id, calls, inner), daemon=True).start()
        return cached

    def _layout(self, run_id: Optional[str], calls: dict, call_id: str) -> dict:
        key = (run_id or ".", call_id, len(calls))  # a call added later re-lays its parent
        with self._lock:
            cached = self._layouts.get(key)
            busy = self._in_flight.setdefault(key, threading.Lock()) if cached is None else None
        if cached is not None:
            return cached
        with busy:  # a request for a layout being prefetched waits for it rather than redoing it
            with self._lock:
                cached = self._layouts.get(key)
            if cached is None:
                cached = layout(calls[call_id], calls)
                with self._lock:
                    self._layouts[key] = cached
                    self._in_flight.pop(key, None)
        return cached

    def _prefetch(self, run_id: Optional[str], calls: dict, call_ids: List[str]) -> None:
        with self._prefetch_lock:  # one graphviz at a time in the background, never many
            for call_id in call_ids:
                try:
                    self._layout(run_id, calls, call_id)
                except Exception:  # noqa: BLE001 - a real request will compute it and report the error
                    return

    def call_series_json(self, run_id: Optional[str], call_id: str, since: Optional[int] = None) -> dict:
        """Every series of one call (a panel), only columns ending at or after ``since``."""
        run = self.run(run_id)
        names = [(k, n) for c, k, n in run.series_names(call_id)]
        out = []
        for kind, name in names:
            out.append(_series_dict(kind, name, run.series(call_id, kind, name, since=since)))
        return {"call": call_id, "stride": run.stride, "series": out}

    def series_json(
        self, run_id: Optional[str], call_id: str, kind: str, name: str, since: Optional[int] = None
    ) -> dict:
        return {"call": call_id, **_series_dict(kind, name, self.run(run_id).series(call_id, kind, name, since=since))}

    def health_json(self, run_id: Optional[str]) -> dict:
        """``run.health()``'s findings and the run's status line (the Health panel, health.js)."""
        from ..health import findings, status_line

        rows = findings(self.run(run_id))
        clean = [{k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in r.items()} for r in rows]
        return {"findings": clean, "status": status_line(rows)}

    def report_page(self, run_id: Optional[str], name: str) -> str:
        """The path of an operation-level page the NaN sentinel saved in the run (no other file)."""
        if not re.fullmatch(r"nonfinite_step\d+\.html", name or ""):
            raise NotFound(f"no report page {name!r}: only nonfinite_step<N>.html pages are served")
        run_dir = self.run(run_id).run_dir
        path = os.path.join(run_dir, name)
        # the run folder may come from anyone: a link leading out of it is not one of its pages
        if os.path.islink(path) or os.path.dirname(os.path.realpath(path)) != os.path.realpath(run_dir):
            raise NotFound(f"this run has no {name} (a link to a file outside the run folder is not served)")
        if not os.path.isfile(path):
            raise NotFound(f"this run has no {name}")
        return path


def _series_dict(kind: str, name: str, s: Any) -> dict:
    """One series as the page reads it."""
    return {
        "kind": kind,
        "name": name,
        "steps": s.steps.tolist(),
        "last_steps": s.last_steps.tolist(),
        "lo": _clean(s.min),
        "hi": _clean(s.max),
        "counts": s.counts.round(3).tolist(),
        "nonfinite": s.nonfinite.tolist(),
        "reason": getattr(s, "reason", None),  # why it has no values, shown in place of the strip
        # over all values (the histogram may be sampled and trimmed): the strip marks where the
        # true range goes beyond it, and draws the line under it
        **{field: _clean(getattr(s, field, [])) for field in EXACT_COLUMNS},
        "line_label": getattr(s, "line_label", ""),
    }


__all__ = ["Catalog", "NotFound"]
