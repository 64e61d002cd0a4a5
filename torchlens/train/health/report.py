"""``run.health()`` (``run`` from ``tl.open_run``; the reader imports this file, not the other
way round): what looks wrong in a training run, where, and since when.

One finding per (call, series, signal), worst first. The signals and their thresholds:

- ``nonfinite``: NaN or Inf. The call is the producer, not the calls it propagated to: from the
  NaN sentinel's record (``tl.watch(on_nonfinite=...)``, exact, any step) when there is one;
  otherwise, at the first logged step with a non-finite output, the first call (in call order)
  whose output holds NaN/Inf while its inputs did not, leaving containers to their inner calls;
  when the forward stayed finite, the last call whose backward sent NaN/Inf to its inputs while
  the gradient reaching its outputs was finite.
- ``exploding``: amplification happens in a call: the call whose backward sends its inputs a
  gradient more than ``GAIN`` (100) times the one reaching its outputs (median per-sample norms,
  the ``io_grad`` lines: the largest input's over the largest output's, at the same step). Only
  when no call does (a gradient that grows a little in each of many layers) the calls whose
  arriving gradient is more than ``FAR`` (1000) times above the run's median of that line, and
  larger than the gradient the loss sends into the model's outputs. A call fed the data is
  judged only where the data's gradient was recorded (``tl.watch(input_grads=True)``).
- ``vanishing``: the gradient arriving at a call's output is more than ``FAR`` times below the
  run's median of that line (over every call and logged step).
  The NaN sentinel (``on_nonfinite=...``, every step) adds the parameter whose gradient norm
  grew 1e6x within 2 steps, or went past what its dtype can square, before anything was NaN.
- ``dead``: at least ``DEAD_FRACTION`` (90%) of an output's values are exactly 0 (dead ReLUs).
- ``saturated``: at least ``SATURATED_FRACTION`` (90%) of a Tanh / Sigmoid / Hardtanh /
  Hardsigmoid output lies within 1e-3 of its bounds (``record/saturation.py`` counts all values).
- ``update_ratio``: with ``log=(..., "updates")``, a weight's ``||dw|| / ||w||`` per step
  outside [1e-4, 1e-2] (about 1e-3 is healthy). Only weights of two or more dimensions: a bias
  or a normalisation parameter starts at 0 or 1, where the ratio says nothing of the step size.

Gradients, dead and saturated outputs are judged on calls that contain no other call (a
container's output is its last inner call's); the root model's own operations are included
when it has no inner call.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..record import SATURATION_EPS, read_saturation
from .sentinel import EVENTS_FILE

FAR = 1e3
GAIN = 1e2  # a call whose backward multiplies the gradient by more than this amplifies it
DEAD_FRACTION = 0.9
SATURATED_FRACTION = 0.9
UPDATE_RATIO = (1e-4, 1e-2)
SIGNALS = ("nonfinite", "exploding", "vanishing", "dead", "saturated", "update_ratio")
COLUMNS = [
    "call",
    "address",
    "series",
    "signal",
    "first_step",
    "latest_step",
    "latest_value",
    "active",
    "explanation",
    "page",
]


def findings(run: Any) -> List[Dict[str, Any]]:
    """The findings of ``run`` as dicts (``COLUMNS``), worst first: by signal in ``SIGNALS``
    order, those still true at the latest logged step first, then by first step."""
    calls = run.calls
    leaves = _leaves(calls)
    names = run.series_names()
    steps = run.steps
    latest = int(steps[-1]) if len(steps) else None
    rows: List[Dict[str, Any]] = []
    rows += _nonfinite(run, calls, names)
    outputs = {
        (c, k, n): run.series(c, k, n)
        for c, k, n in names
        if c in leaves and k in ("io", "io_grad") and n.startswith("output")
    }
    loss_grads = [run.series(c, k, n) for c, k, n in names if c == "" and k == "io_grad" and n.startswith("output")]
    rows += _diverging(run.run_dir)
    sent_back = {(c, k, n): run.series(c, k, n) for c, k, n in names if c in leaves and k == "io_grad"}
    amplifiers = _amplifiers({key: s for key, s in sent_back.items() if not key[2].startswith("output")}, sent_back)
    rows += amplifiers
    grads = _gradients({key: s for key, s in outputs.items() if key[1] == "io_grad"}, loss_grads)
    rows += [r for r in grads if not (amplifiers and r["signal"] == "exploding")]  # the amplifier explains them
    rows += _dead({key: s for key, s in outputs.items() if key[1] == "io"})
    rows += _saturated(run.run_dir, calls)
    rows += _updates(run, names, calls)
    for row in rows:
        row.setdefault("page", None)
        row["address"] = calls[row["call"]].address if row["call"] in calls else row["call"]
        row.setdefault("latest_step", latest)
        if "active" not in row:
            row["active"] = row["latest_step"] == latest
    rank = {s: i for i, s in enumerate(SIGNALS)}
    rows.sort(key=lambda r: (rank[r["signal"]], not r["active"], r["first_step"], r["call"]))
    return [{c: r.get(c) for c in COLUMNS} for r in rows]


def health(run: Any) -> Any:
    """``findings(run)`` as a pandas DataFrame (columns ``COLUMNS``), worst first.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
        >>> with torch.no_grad():
        ...     _ = model[0].weight.fill_(100.0)
        >>> folder = tempfile.mkdtemp()
        >>> with tl.watch(model, run_dir=folder, backend=None, verbose=False):
        ...     for _ in range(3):
        ...         model(torch.rand(8, 3) + 1).sum().backward()
        >>> h = tl.open_run(folder).health()
        >>> h[["call", "signal", "first_step"]].values.tolist()  # the saturated tanh passes ~no gradient back
        [['0:1', 'vanishing', 0], ['1:1', 'saturated', 0]]
    """
    try:
        import pandas as pd
    except ImportError as error:
        raise ImportError("run.health() returns a pandas DataFrame: pip install pandas") from error
    return pd.DataFrame(findings(run), columns=COLUMNS)


def status_line(rows: List[Dict[str, Any]]) -> str:
    """The run in one line: the first NaN and where, else how many findings are true at the
    latest step, else 'healthy' (findings that ended earlier are counted apart, not alarmed on).

    Example:
        >>> status_line([])
        'healthy: no finding'
        >>> status_line([{"signal": "update_ratio", "active": False}])
        'healthy now: 1 finding ended earlier (update_ratio)'
    """
    bad = [r for r in rows if r["signal"] == "nonfinite"]
    if bad:
        r = bad[0]
        return f"NaN/Inf since step {r['first_step']} in {r['address'] or 'the model itself'}: {r['explanation']}"
    if not rows:
        return "healthy: no finding"
    now = [r for r in rows if r.get("active", True)]
    ended = len(rows) - len(now)
    earlier = f"{ended} finding{'s' if ended > 1 else ''} ended earlier"
    if not now:
        kinds = sorted({r["signal"] for r in rows}, key=SIGNALS.index)
        return f"healthy now: {earlier} ({', '.join(kinds)})"
    kinds = sorted({r["signal"] for r in now}, key=SIGNALS.index)
    line = f"{len(now)} finding{'s' if len(now) > 1 else ''}: {', '.join(kinds)}"
    return f"{line}; {earlier}" if ended else line


# ----- the signals ----------------------------------------------------------------------------
def _leaves(calls: Dict[str, Any]) -> set:
    parents = {c.parent for c in calls.values() if c.parent is not None}
    leaves = {cid for cid in calls if cid not in parents}
    return leaves or set(calls)


def _bad(s: Any) -> np.ndarray:
    """Non-finite values per column: exact when recorded, else those the sample saw."""
    exact = s.nan + s.posinf + s.neginf if len(s.nan) == len(s.steps) else np.full(len(s.steps), np.nan)
    return np.where(np.isfinite(exact), exact, s.nonfinite)


def _nonfinite(run: Any, calls: Dict[str, Any], names: List[Tuple[str, str, str]]) -> List[Dict[str, Any]]:
    events = _events(run.run_dir)
    if events:
        return [_event_row(e) for e in events[:1]]
    forward = _first_bad(run, [(c, n) for c, k, n in names if k == "io"], "io")
    backward = _first_bad(run, [(c, n) for c, k, n in names if k == "io_grad"], "io_grad")
    if forward is None and backward is None:
        return []
    order = list(calls)

    def producer(at: Dict[str, Dict[str, float]], bad: str, good: str, last: bool) -> str:
        found = [c for c, v in at.items() if v[bad] > 0 and v[good] == 0]
        inner = [c for c in found if not any(_inside(calls, o, c) for o in found if o != c)]
        rank = sorted(inner or found or list(at), key=lambda c: order.index(c) if c in order else len(order))
        return rank[-1] if last else rank[0]

    if forward is not None and (backward is None or forward[0] <= backward[0]):
        step, at = forward
        chosen = producer(at, "out", "in", last=False)
        n = at.get(chosen, {}).get("out", 0)
        series, why = "io/output", f"its output held {int(n)} NaN/Inf value(s) while its inputs were finite"
    else:
        assert backward is not None
        step, at = backward
        chosen = producer(at, "in", "out", last=True)  # backward runs the calls in reverse
        n = at.get(chosen, {}).get("in", 0)
        series = "io_grad/input"
        why = f"its backward sent {int(n)} NaN/Inf gradient value(s) to its inputs from a finite gradient"
    return [
        {
            "call": chosen,
            "series": series,
            "signal": "nonfinite",
            "first_step": step,
            "latest_value": n,
            "explanation": f"{why} (the first logged step with any)",
        }
    ]


def _first_bad(run: Any, keys: List[Tuple[str, str]], kind: str) -> Optional[Tuple[int, Dict[str, Dict[str, float]]]]:
    """The first logged step where a series of ``kind`` holds NaN/Inf, and per call the number of
    such values in its inputs and its outputs at that step (None: never)."""
    series = [(c, n, run.series(c, kind, n)) for c, n in keys]
    first: Optional[int] = None
    for _, _, s in series:
        hit = np.nonzero(_bad(s) > 0)[0]
        if len(hit):
            step = int(s.steps[hit[0]])
            first = step if first is None else min(first, step)
    if first is None:
        return None
    at: Dict[str, Dict[str, float]] = {}
    for cid, name, s in series:
        where = np.nonzero(s.steps == first)[0]
        if len(where):
            counts = at.setdefault(cid, {"in": 0.0, "out": 0.0})
            counts["out" if name.startswith("output") else "in"] += float(_bad(s)[where[0]])
    return first, at


def _inside(calls: Dict[str, Any], cid: str, ancestor: str) -> bool:
    parent = calls[cid].parent
    while parent is not None:
        if parent == ancestor:
            return True
        parent = calls[parent].parent if parent in calls else None
    return False


def _events(run_dir: str, key: str = "events") -> List[dict]:
    try:
        with open(os.path.join(run_dir, EVENTS_FILE), encoding="utf-8") as f:
            return list(json.load(f).get(key, []))
    except (OSError, ValueError):
        return []


def _diverging(run_dir: str) -> List[Dict[str, Any]]:
    """The sentinel's divergence finding: the parameter whose gradient norm exploded."""
    return [
        {
            "call": e.get("call") or "",
            "series": f"params_grad/{str(e['parameter']).rpartition('.')[2]}",
            "signal": "exploding",
            "first_step": int(e["step"]),
            "latest_value": None,
            "explanation": f"{e['detail']}, while every value was still finite (the NaN sentinel)",
        }
        for e in _events(run_dir, "diverging")
    ]


def _event_row(event: dict) -> Dict[str, Any]:
    report = event.get("report") or {}
    explanation = event.get("detail") or "went non-finite"
    if report.get("found") and report.get("label"):
        where = f" at line {report['line']} `{report.get('code', '')}`" if report.get("line") else ""
        explanation = f"{report.get('kind') or 'NaN/Inf'} made by {report['label']}{where} ({report.get('phase')})"
    return {
        "call": event.get("call") or "",
        "series": "io_grad/output" if event.get("phase") == "backward" else "io/output",
        "signal": "nonfinite",
        "first_step": int(event["step"]),
        "latest_value": report.get("kind"),
        "explanation": explanation,
        "page": event.get("page"),
        "active": True,
    }


def _gradients(grads: Dict[Tuple[str, str, str], Any], loss_grads: List[Any]) -> List[Dict[str, Any]]:
    lines = [s.line[np.isfinite(s.line) & (s.line > 0)] for s in grads.values() if len(s.line)]
    pooled = np.concatenate(lines) if lines else np.zeros(0)
    if not len(pooled):
        return []
    reference = float(np.median(pooled))
    sent: Dict[int, float] = {}  # step -> the largest gradient the loss sent into the model's outputs
    for s in loss_grads:
        for step, value in zip(s.steps.tolist(), s.line.tolist()):
            sent[step] = max(sent.get(step, -math.inf), value)
    rows = []
    for (cid, kind, name), s in grads.items():
        if not len(s.steps) or len(s.line) != len(s.steps):  # no values (a reason says why), or an old run
            continue
        ratio = s.line / reference
        amplified = np.array(
            [v > sent.get(st, -math.inf) for st, v in zip(s.steps.tolist(), s.line.tolist())], dtype=bool
        )
        for signal, hit in (("exploding", (ratio > FAR) & amplified), ("vanishing", ratio < 1 / FAR)):
            where = np.nonzero(hit & np.isfinite(ratio))[0]
            if not len(where):
                continue
            value = float(s.line[-1])
            direction = "above" if signal == "exploding" else "below"
            rows.append(
                {
                    "call": cid,
                    "series": f"{kind}/{name}",
                    "signal": signal,
                    "first_step": int(s.steps[where[0]]),
                    "latest_step": int(s.last_steps[-1]),
                    "latest_value": value,
                    "active": bool(hit[-1]),
                    "explanation": f"the gradient reaching it has a median per-sample norm of {_fmt(value)}, "
                    f"over {FAR:g}x {direction} the run's median ({_fmt(reference)})",
                }
            )
    return rows


def _amplifiers(
    inputs: Dict[Tuple[str, str, str], Any], grads: Dict[Tuple[str, str, str], Any]
) -> List[Dict[str, Any]]:
    """Calls whose backward multiplies the gradient by more than ``GAIN`` (see the module's text)."""
    by_call: Dict[str, List[Tuple[str, Any]]] = {}
    for (cid, _, name), s in inputs.items():
        by_call.setdefault(cid, []).append((name, s))
    rows = []
    for cid, ins in by_call.items():
        outs = [s for (c, _, n), s in grads.items() if c == cid and n.startswith("output")]
        reaching = _per_step(outs)
        sent = {name: _per_step([s]) for name, s in ins}
        steps = sorted(st for st in reaching if any(st in v for v in sent.values()))
        gains = []  # (step, gain, input name, sent, reaching)
        for st in steps:
            name, value = max(((n, v[st]) for n, v in sent.items() if st in v), key=lambda nv: nv[1])
            gains.append((st, value / reaching[st] if reaching[st] > 0 else math.nan, name, value, reaching[st]))
        hits = [g for g in gains if math.isfinite(g[1]) and g[1] > GAIN]
        if not hits:
            continue
        step, gain, name, value, arriving = hits[-1]
        rows.append(
            {
                "call": cid,
                "series": f"io_grad/{name}",
                "signal": "exploding",
                "first_step": hits[0][0],
                "latest_step": gains[-1][0],
                "latest_value": gain,
                "active": hits[-1] is gains[-1],
                "explanation": f"its backward multiplies the gradient by {_fmt(gain)}: it sends {name} a median "
                f"per-sample norm of {_fmt(value)} from {_fmt(arriving)} reaching its output (step {step}; "
                f"over {GAIN:g}x: the gradient explodes here)",
            }
        )
    return rows


def _per_step(series: List[Any]) -> Dict[int, float]:
    """Step -> the largest ``line`` (median per-sample norm) of ``series`` at that step."""
    out: Dict[int, float] = {}
    for s in series:
        if len(s.line) != len(s.steps):
            continue
        for st, v in zip(s.steps.tolist(), s.line.tolist()):
            if math.isfinite(v):
                out[st] = max(out.get(st, -math.inf), v)
    return out


def _dead(outputs: Dict[Tuple[str, str, str], Any]) -> List[Dict[str, Any]]:
    rows = []
    for (cid, kind, name), s in outputs.items():
        if len(s.zeros) != len(s.steps) or not len(s.steps):
            continue
        fraction = s.zeros / np.where(s.count > 0, s.count, np.nan)
        hit = fraction >= DEAD_FRACTION
        where = np.nonzero(hit)[0]
        if len(where):
            rows.append(
                {
                    "call": cid,
                    "series": f"{kind}/{name}",
                    "signal": "dead",
                    "first_step": int(s.steps[where[0]]),
                    "latest_step": int(s.last_steps[-1]),
                    "latest_value": float(fraction[-1]),
                    "active": bool(hit[-1]),
                    "explanation": f"{fraction[-1]:.0%} of its output values are exactly 0 (dead units pass no gradient)",
                }
            )
    return rows


def _saturated(run_dir: str, calls: Dict[str, Any]) -> List[Dict[str, Any]]:
    lines = read_saturation(run_dir)
    first: Dict[str, int] = {}
    last: Dict[str, Tuple[int, float]] = {}
    for line in lines:
        for cid, (near, n) in line["calls"].items():
            fraction = near / n if n else 0.0
            last[cid] = (line["step"], fraction)
            if fraction >= SATURATED_FRACTION and cid not in first:
                first[cid] = line["step"]
    latest = lines[-1]["step"] if lines else None
    rows = []
    for cid, step in first.items():
        when, fraction = last[cid]
        cls = calls[cid].class_name if cid in calls else "activation"
        rows.append(
            {
                "call": cid,
                "series": "io/output 0",
                "signal": "saturated",
                "first_step": step,
                "latest_step": when,
                "latest_value": fraction,
                "active": when == latest and fraction >= SATURATED_FRACTION,
                "explanation": f"{fraction:.0%} of this {cls}'s outputs are within "
                f"{SATURATION_EPS:g} of its bounds, where its gradient is ~0",
            }
        )
    return rows


def _updates(run: Any, names: List[Tuple[str, str, str]], calls: Dict[str, Any]) -> List[Dict[str, Any]]:
    lo, hi = UPDATE_RATIO
    rows = []
    for cid, kind, name in names:
        shape = dict((n, s) for n, s in calls[cid].params).get(name) if cid in calls else None
        if kind != "updates" or shape is None or len(shape) < 2:  # weights only (see the module's doc)
            continue
        s = run.series(cid, kind, name)
        ratio = s.line
        hit = np.isfinite(ratio) & ((ratio < lo) | (ratio > hi))
        where = np.nonzero(hit)[0]
        if not len(where):
            continue
        value = float(ratio[-1])
        size = "small" if value < lo else "large" if value > hi else "back in range"
        rows.append(
            {
                "call": cid,
                "series": f"{kind}/{name}",
                "signal": "update_ratio",
                "first_step": int(s.steps[where[0]]),
                "latest_step": int(s.last_steps[-1]),
                "latest_value": value,
                "active": bool(hit[-1]),
                "explanation": f"each optimizer step changes {name} by {_fmt(value)} of its size: too {size} "
                f"(about 1e-3 is healthy; outside [{lo:g}, {hi:g}] the learning rate is likely off)"
                if size != "back in range"
                else f"its update/weight ratio left [{lo:g}, {hi:g}] and is now {_fmt(value)}",
            }
        )
    return rows


def _fmt(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:.3g}"


__all__ = [
    "health",
    "findings",
    "status_line",
    "SIGNALS",
    "COLUMNS",
    "FAR",
    "GAIN",
    "DEAD_FRACTION",
    "SATURATED_FRACTION",
]
