"""The run database: one SQLite file (``run.db``) in the run folder, written by training and
read by the page and ``tl.open_run`` at the same time (WAL mode).

Tables: ``meta`` (format, model, options, status, and the writer's ``pid``, ``host`` and
``heartbeat``, the time of its last sign of life), ``calls`` (the module-call graph, one JSON row per
call), ``series`` (one row per (call, kind, name), with the ``reason`` a gradient series has no
values while it has none; runs written before have no such column), ``columns`` (one histogram per series and
column) and ``steps`` (the logged training steps).

The writer's heartbeat is renewed with every logged step and by a timer every ``HEARTBEAT_S``
seconds while the watch is open, so a reader can tell a run whose process was killed (its pid
gone, or its heartbeat old) from one that is only between steps.

Long runs stay bounded: a column covers ``stride`` logged steps, and when a run would pass
``max_columns`` columns the stride doubles and neighbouring columns are merged.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import threading
import time
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from ..web.stats import merge
from .calls import Call

FORMAT = "torchlens-run-1"
DB_NAME = "run.db"
KINDS = ("io", "io_grad", "params", "params_grad")
HEARTBEAT_S = 10.0  # the heartbeat timer's period; a reader calls a run stopped well after it

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, ord INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY, call_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, reason TEXT,
    UNIQUE (call_id, kind, name));
CREATE TABLE IF NOT EXISTS columns (
    series_id INTEGER NOT NULL, slot INTEGER NOT NULL, step INTEGER NOT NULL, last_step INTEGER NOT NULL,
    num_steps INTEGER NOT NULL, lo REAL, hi REAL, nonfinite INTEGER NOT NULL, counts BLOB NOT NULL,
    PRIMARY KEY (series_id, slot)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS columns_by_step ON columns (series_id, last_step);
CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, ordinal INTEGER NOT NULL, time REAL NOT NULL);
"""


def connect(path: str, timeout: float = 30.0) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=timeout, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA busy_timeout = %d" % int(timeout * 1000))
    return db


class RunWriter:
    """Appends logged steps to a run database. Used by the training process only."""

    def __init__(self, run_dir: str, model_name: str, options: dict, bins: int, max_columns: int = 512) -> None:
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, DB_NAME)
        self.bins = bins
        self.max_columns = max_columns
        self.db = connect(self.path)
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = NORMAL")  # a killed process loses nothing committed
        self.stride = 1
        self.num_logged = 0
        self.series_ids: Dict[Tuple[str, str, str], int] = {}
        self.reason_of: Dict[int, Optional[str]] = {}  # series id -> its stored reason
        self.has_values: set = set()  # series ids that got values (their reason is gone for good)
        self.num_calls = 0
        meta = {
            "format": FORMAT,
            "model": model_name,
            "options": json.dumps(options),
            "bins": str(bins),
            "stride": "1",
            "max_columns": str(max_columns),
            "created": str(time.time()),
            "status": "running",
            "pid": str(os.getpid()),
            "host": socket.gethostname(),
            "heartbeat": str(time.time()),
        }
        with self.db:  # tables and meta in one transaction: a reader never sees half a run
            self.db.execute("BEGIN IMMEDIATE")
            for statement in filter(str.strip, _SCHEMA.split(";")):
                self.db.execute(statement)
            self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
        self._stop_beating = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="torchlens-heartbeat", daemon=True)
        self._beater.start()

    def _beat(self) -> None:
        """Renew the heartbeat every HEARTBEAT_S seconds until close(), on a connection of its own
        (the training thread's transactions stay its own). A missed beat is harmless."""
        db = None
        try:
            db = connect(self.path, timeout=1.0)
            while not self._stop_beating.wait(HEARTBEAT_S):
                try:
                    db.execute("INSERT OR REPLACE INTO meta VALUES ('heartbeat', ?)", (str(time.time()),))
                except sqlite3.Error:  # busy or briefly locked: the next beat, or the next step, renews it
                    pass
        except sqlite3.Error:
            pass
        finally:
            if db is not None:
                db.close()

    def set_status(self, status: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('status', ?)", (status,))

    def add_calls(self, calls: Iterable[Call]) -> None:
        rows = []
        for call in calls:
            rows.append((call.id, self.num_calls, json.dumps(call.to_dict())))
            self.num_calls += 1
        with self.db:
            self.db.execute("BEGIN")
            self.db.executemany("INSERT OR REPLACE INTO calls VALUES (?, ?, ?)", rows)

    def _series_id(self, key: Tuple[str, str, str]) -> int:
        sid = self.series_ids.get(key)
        if sid is None:
            self.db.execute("INSERT OR IGNORE INTO series (call_id, kind, name) VALUES (?, ?, ?)", key)
            sid = self.db.execute("SELECT id FROM series WHERE call_id = ? AND kind = ? AND name = ?", key).fetchone()[
                0
            ]
            self.series_ids[key] = sid
        return sid

    def write_step(
        self,
        step: int,
        keys: List[Tuple[str, str, str]],
        counts: np.ndarray,
        lo: np.ndarray,
        hi: np.ndarray,
        nonfinite: np.ndarray,
        reasons: Optional[Dict[Tuple[str, str, str], str]] = None,
    ) -> None:
        """Store one logged step (row ``i`` of the arrays belongs to ``keys[i]``), in one transaction;
        ``reasons``: why the series named there got no values in this step."""
        ordinal = self.num_logged
        if ordinal // self.stride >= self.max_columns:
            self._compact()
        slot = ordinal // self.stride
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            now = time.time()
            self.db.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", (step, ordinal, now))
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('heartbeat', ?)", (str(now),))
            fresh, merged = [], []
            for i, key in enumerate(keys):
                sid = self._series_id(key)
                row = (
                    sid,
                    slot,
                    step,
                    step,
                    1,
                    _real(lo[i]),
                    _real(hi[i]),
                    int(nonfinite[i]),
                    counts[i].astype(np.float32).tobytes(),
                )
                if self.stride == 1 or ordinal % self.stride == 0:
                    fresh.append(row)
                else:
                    merged.append(row)
            self.db.executemany("INSERT OR REPLACE INTO columns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", fresh)
            for row in merged:
                self._merge_into(row)
            self._set_reasons([(self._series_id(k), None) for k in keys])
            self._set_reasons([(self._series_id(k), r) for k, r in (reasons or {}).items()])
        self.num_logged += 1

    def _set_reasons(self, pairs: List[Tuple[int, Optional[str]]]) -> None:
        """Store each series' reason when it changes; a series that has had values keeps none."""
        for sid, reason in pairs:
            if reason is None:
                self.has_values.add(sid)
            elif sid in self.has_values:
                continue
            if self.reason_of.get(sid) != reason:
                self.db.execute("UPDATE series SET reason = ? WHERE id = ?", (reason, sid))
                self.reason_of[sid] = reason

    def _merge_into(self, row: tuple) -> None:
        sid, slot, step = row[0], row[1], row[2]
        old = self.db.execute(
            "SELECT step, num_steps, lo, hi, nonfinite, counts FROM columns WHERE series_id = ? AND slot = ?",
            (sid, slot),
        ).fetchone()
        if old is None:
            self.db.execute("INSERT INTO columns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            return
        lo, hi, counts = merge(
            _nan(old[2]),
            _nan(old[3]),
            np.frombuffer(old[5], np.float32),
            _nan(row[5]),
            hi_b=_nan(row[6]),
            counts_b=np.frombuffer(row[8], np.float32),
        )
        self.db.execute(
            "UPDATE columns SET last_step = ?, num_steps = ?, lo = ?, hi = ?, nonfinite = ?, "
            "counts = ? WHERE series_id = ? AND slot = ?",
            (step, old[1] + 1, _real(lo), _real(hi), old[4] + row[7], counts.tobytes(), sid, slot),
        )

    def _compact(self) -> None:
        """Double the stride: columns ``2k`` and ``2k + 1`` of every series become column ``k``."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            rows = self.db.execute(
                "SELECT series_id, slot, step, last_step, num_steps, lo, hi, nonfinite, counts "
                "FROM columns ORDER BY series_id, slot"
            ).fetchall()
            combined: Dict[Tuple[int, int], list] = {}  # [first, last, num_steps, lo, hi, nonfinite, counts]
            for sid, slot, step, last, num, lo, hi, nonfinite, counts in rows:
                key = (sid, slot // 2)
                c = np.frombuffer(counts, np.float32)
                prev = combined.get(key)
                if prev is None:
                    combined[key] = [step, last, num, _nan(lo), _nan(hi), nonfinite, c]
                    continue
                mlo, mhi, mc = merge(prev[3], prev[4], prev[6], _nan(lo), hi_b=_nan(hi), counts_b=c)
                combined[key] = [
                    min(prev[0], step),
                    max(prev[1], last),
                    prev[2] + num,
                    mlo,
                    mhi,
                    prev[5] + nonfinite,
                    mc,
                ]
            self.db.execute("DELETE FROM columns")
            self.db.executemany(
                "INSERT INTO columns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        sid,
                        slot,
                        v[0],
                        v[1],
                        v[2],
                        _real(v[3]),
                        _real(v[4]),
                        v[5],
                        np.asarray(v[6], np.float32).tobytes(),
                    )
                    for (sid, slot), v in combined.items()
                ],
            )
            self.stride *= 2
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('stride', ?)", (str(self.stride),))

    def close(self, status: str = "finished") -> None:
        if self.db is None:
            return
        self._stop_beating.set()
        self._beater.join(timeout=5)
        self.set_status(status)
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError:  # a reader holds the log; it is checkpointed later
            pass
        self.db.close()
        self.db = None


def _real(x: float) -> Optional[float]:
    x = float(x)
    return x if np.isfinite(x) else None


def _nan(x: Optional[float]) -> float:
    return float("nan") if x is None else float(x)


def new_run_dir(run_dir: Optional[str], model_name: str) -> str:
    """The folder a new run is written to: ``run_dir``, or a fresh one under ./torchlens_runs/;
    refused when it already holds a run or cannot be written."""
    if run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = os.path.join(os.getcwd(), "torchlens_runs", f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', model_name)}")
        run_dir, k = base, 1
        while os.path.exists(run_dir):
            k += 1
            run_dir = f"{base}-{k}"
    run_dir = os.path.abspath(run_dir)
    if os.path.exists(os.path.join(run_dir, "run.db")):
        raise FileExistsError(
            f"torchlens.train: {run_dir} already holds a run. Pass a new run_dir (or none for "
            "a fresh folder under ./torchlens_runs/)."
        )
    try:
        os.makedirs(run_dir, exist_ok=True)
        probe = os.path.join(run_dir, ".write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        raise PermissionError(
            f"torchlens.train: cannot write the run folder {run_dir} ({error.strerror}). Pass a writable run_dir."
        ) from None
    return run_dir


__all__ = ["new_run_dir", "RunWriter", "connect", "DB_NAME", "FORMAT", "KINDS", "HEARTBEAT_S"]
