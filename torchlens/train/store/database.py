"""The run database: one SQLite file (``run.db``) in the run folder, written by training and
read by the page and ``tl.open_run`` at the same time (WAL mode).

Tables: ``meta`` (format, model, options, status, and the writer's ``pid``, ``host`` and
``heartbeat``, the time of its last sign of life), ``calls`` (the module-call graph, one JSON row per
call), ``series`` (one row per (call, kind, name), with the ``reason`` a gradient series has no
values while it has none; runs written before have no such column), ``columns`` (one histogram per series and
column, and the statistics over all values of its tensors, ``EXACT_COLUMNS``: runs written before
have none), ``steps`` (the logged training steps) and ``timeline`` (when each logged step's
forward, backward and optimizer step ran, and the watch's own work: ``step/timeline.py``; runs written
before have no such table).

A step is written when its backward pass ends; a later backward pass of the same step (or its
optimizer step, for ``updates``) writes it again: ``write_step`` with the step being written
replaces its columns, also those merged into a column holding older steps.

The writer's heartbeat is renewed with every logged step and by a timer every ``HEARTBEAT_S``
seconds while the watch is open, so a reader can tell a run whose process was killed (its pid
gone, or its heartbeat old) from one that is only between steps.

Long runs stay bounded: a column covers ``stride`` logged steps, and when a run would pass
``max_columns`` columns the stride doubles and neighbouring columns are merged.
"""

from __future__ import annotations

import json
import operator
import os
import re
import socket
import sqlite3
import threading
import time
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ...arguments import PathNotWritableError
from ..model import Call
from .columns import EXACT_COLUMNS, combine_columns, compact_columns, nullable

FORMAT = "torchlens-run-1"
DB_NAME = "run.db"
KINDS = ("io", "io_grad", "params", "params_grad", "updates")
_SERIES_ID = operator.itemgetter(0)  # of a row of ``columns``
_ROW = "(" + ", ".join("?" * (9 + len(EXACT_COLUMNS))) + ")"
CHECKPOINT_PAGES = 2000  # log pages (4 KiB) let accumulate before ``RunWriter.checkpoint`` copies them
TIMELINE_STEPS = 10_000  # logged steps whose timeline is kept (the newest; older ones are dropped)
HEARTBEAT_S = 10.0  # the heartbeat timer's period; a reader calls a run stopped well after it


class TimelineRow(NamedTuple):
    """One row of the run's ``timeline`` table (see ``torchlens/train/step/timeline.py``)."""

    step: int
    thread: str  # 'training' or 'writer'
    phase: str  # forward, backward, optimizer, watch, hooks, write
    start_ns: int
    end_ns: int
    busy_ns: Optional[int] = None  # hooks: their summed time; otherwise None (the span itself)


# ``columns`` is an ordinary (rowid) table: a step's rows, one per series, are appended side by
# side, and the key (series_id, slot) is a small index beside them. Kept in key order (WITHOUT
# ROWID), each ~400-byte row would land in its own series' full leaf and split it: about three
# pages a row, some 1,300 pages (5 MB) of log per commit at 432 series, and the log's automatic
# checkpoint inside nearly every commit, which a durable step waits for (~5x slower writes).
# Reading a series is about as fast either way. Runs written before keep their schema: the
# statements are the same.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (id TEXT PRIMARY KEY, ord INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY, call_id TEXT NOT NULL, kind TEXT NOT NULL, name TEXT NOT NULL, reason TEXT,
    UNIQUE (call_id, kind, name));
CREATE TABLE IF NOT EXISTS columns (
    series_id INTEGER NOT NULL, slot INTEGER NOT NULL, step INTEGER NOT NULL, last_step INTEGER NOT NULL,
    num_steps INTEGER NOT NULL, lo REAL, hi REAL, nonfinite INTEGER NOT NULL, counts BLOB NOT NULL,
    x_count REAL, x_min REAL, x_max REAL, x_mean REAL, x_std REAL, x_nan REAL, x_posinf REAL, x_neginf REAL,
    x_zeros REAL, x_line REAL,
    PRIMARY KEY (series_id, slot));
CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, ordinal INTEGER NOT NULL, time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS timeline (
    step INTEGER NOT NULL, thread TEXT NOT NULL, phase TEXT NOT NULL, start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL, busy_ns INTEGER, PRIMARY KEY (step, thread, phase, start_ns)) WITHOUT ROWID;
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
        # the log is copied back by ``checkpoint`` (while training does not wait); sqlite's own
        # automatic checkpoint, inside a commit, only past what that lets accumulate
        self.db.execute(f"PRAGMA wal_autocheckpoint = {4 * CHECKPOINT_PAGES}")
        self.commits_unchecked = 0  # commits since the last ``checkpoint``
        self._pages_per_commit = float(CHECKPOINT_PAGES)  # log pages a commit adds (the last checkpoint found)
        self.stride = 1
        self.num_logged = 0
        self.series_ids: Dict[Tuple[str, str, str], int] = {}
        self.reason_of: Dict[int, str] = {}  # series id -> its stored reason (series with none left out)
        self.has_values: set = set()  # series ids that got values (their reason is gone for good)
        self.num_calls = 0
        self._open: Optional[Tuple[int, int]] = None  # (step, ordinal) of the step written last
        # the open slot's columns (series id -> its row as stored), and as they were before the
        # step written last: a step is merged into them without reading them back
        self._slot: Dict[int, tuple] = {}
        self._before: Dict[int, tuple] = {}
        self.timeline_origin = time.perf_counter_ns()  # the step timeline's zero
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
            "timeline_origin": str(self.timeline_origin),
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
        exact: Optional[np.ndarray] = None,
        timeline: Sequence[tuple] = (),
    ) -> bool:
        """Store one logged step (row ``i`` of the arrays belongs to ``keys[i]``), in one transaction;
        ``reasons``: why the series named there got no values in this step; ``exact``: rows of
        ``EXACT_FIELDS`` (``Histograms.exact``); ``timeline``: rows of the step timeline, written in
        the same transaction. Writing the step written last again replaces the columns of the keys
        given. True when the step is new."""
        new = self._open is None or self._open[0] != step
        if new:
            ordinal = self.num_logged
            if ordinal // self.stride >= self.max_columns:
                self._compact()
            if ordinal % self.stride == 0:  # the first step of a new column
                self._slot = {}
            self._open, self._before = (step, ordinal), dict(self._slot)
        ordinal = self._open[1]  # type: ignore[index]
        slot = ordinal // self.stride
        stats = _stored_statistics([k[1] for k in keys], exact)
        ends = nullable(np.stack([np.asarray(lo, float), np.asarray(hi, float)], axis=1))
        blobs = np.ascontiguousarray(counts, np.float32)
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            now = time.time()
            self.db.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", (step, ordinal, now))
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('heartbeat', ?)", (str(now),))
            sids = [self._series_id(key) for key in keys]
            # plain lists zipped, not numpy rows indexed: this runs for every series of every write
            heads = zip(sids, ends, np.asarray(nonfinite).tolist())  # (id, [lo, hi], non-finite count)
            rows = [
                (sid, slot, step, step, 1, lo_hi[0], lo_hi[1], int(bad), blob.tobytes(), *stat)
                for (sid, lo_hi, bad), blob, stat in zip(heads, blobs, stats)
            ]
            rows = self._merged(rows)
            self.db.executemany("INSERT OR REPLACE INTO columns VALUES " + _ROW, rows)
            self._have_values(sids)
            self._set_reasons([(self._series_id(k), r) for k, r in (reasons or {}).items()])
            self._add_timeline(timeline, prune=new and ordinal % 1000 == 999)
        self._slot.update(zip(map(_SERIES_ID, rows), rows))  # only once committed
        if new:
            self.num_logged += 1
        self.commits_unchecked += 1
        return new

    @property
    def log_pages_per_commit(self) -> float:
        """Log pages a commit added, as the last ``checkpoint`` found them."""
        return self._pages_per_commit

    def checkpoint(self) -> None:
        """Copy the log back into the database once it holds about ``CHECKPOINT_PAGES`` pages,
        called while training does not wait for the writer (a backward pass): the commit that
        crosses sqlite's own threshold would copy them, and training would wait for it. Every
        step's commit rewrites the same pages of the key's index (one per series): copied back
        every few steps, each goes once, with one pair of syncs. Passive: a reader is never
        blocked."""
        if self.db is None or self.commits_unchecked * self._pages_per_commit < CHECKPOINT_PAGES:
            return
        commits, self.commits_unchecked = self.commits_unchecked, 0
        try:
            # run to its end: no statement left open
            _, logged, _ = self.db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()[0]
        except sqlite3.OperationalError:  # busy: the next one copies them
            return
        if logged > 0:
            self._pages_per_commit = max(1.0, logged / commits)

    def write_timeline(self, rows: Sequence[tuple]) -> None:
        """Store timeline rows left when no step is written any more (at close)."""
        if rows:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                self._add_timeline(rows)

    def _add_timeline(self, rows: Sequence[tuple], prune: bool = False) -> None:
        if rows:
            self.db.executemany("INSERT OR REPLACE INTO timeline VALUES (?, ?, ?, ?, ?, ?)", rows)
        if prune:  # a long run keeps the timeline of its newest TIMELINE_STEPS logged steps
            self.db.execute(
                "DELETE FROM timeline WHERE step < (SELECT step FROM steps ORDER BY ordinal DESC LIMIT 1 OFFSET ?)",
                (TIMELINE_STEPS - 1,),
            )

    def _have_values(self, sids: List[int]) -> None:
        """These series got values: each keeps no reason (``_set_reasons`` with None, for all at once)."""
        self.has_values.update(sids)
        reason_of = self.reason_of
        for sid in reason_of.keys() & sids:  # mostly none, after the first step (found in C)
            self.db.execute("UPDATE series SET reason = ? WHERE id = ?", (None, sid))
            del reason_of[sid]

    def _set_reasons(self, pairs: List[Tuple[int, Optional[str]]]) -> None:
        """Store each series' reason when it changes; a series that has had values keeps none."""
        for sid, reason in pairs:
            if reason is None:
                self.has_values.add(sid)
            elif sid in self.has_values:
                continue
            if self.reason_of.get(sid) != reason:
                self.db.execute("UPDATE series SET reason = ? WHERE id = ?", (reason, sid))
                if reason is None:
                    del self.reason_of[sid]
                else:
                    self.reason_of[sid] = reason

    def _merged(self, rows: List[tuple]) -> List[tuple]:
        """The rows of a step, each merged into its series' column of older steps (as the column
        was before this step, when the step is written again): all in one ``combine_columns``."""
        if not self._before:  # the step opens a column (always, until the columns are compacted)
            return rows
        older = [i for i, row in enumerate(rows) if row[0] in self._before]
        if not older:
            return rows
        merged = combine_columns([self._before[rows[i][0]] for i in older], [rows[i] for i in older], self.bins)
        rows = list(rows)
        for i, row in zip(older, merged):
            rows[i] = row
        return rows

    def _compact(self) -> None:
        """Double the stride: columns ``2k`` and ``2k + 1`` of every series become column ``k``."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            # in the table's own order (a step's rows side by side): a third faster to read than
            # in key order, which looks each row up; compact_columns sorts them
            rows = self.db.execute("SELECT * FROM columns").fetchall()
            compacted = compact_columns(rows, self.bins)
            self.db.execute("DELETE FROM columns")
            self.db.executemany("INSERT INTO columns VALUES " + _ROW, compacted)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('stride', ?)", (str(self.stride * 2),))
        self.stride *= 2
        # the next step's column may hold older steps already (an odd max_columns)
        slot = self.num_logged // self.stride
        self._slot = {row[0]: row for row in compacted if row[1] == slot}

    def close(self, status: str = "finished") -> None:
        if self.db is None:
            return
        self._stop_beating.set()
        self._beater.join(timeout=5)
        try:
            self.set_status(status)
        except sqlite3.Error:  # a full disk: the run stays 'running', and reads 'stopped' once the process is gone
            pass
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.OperationalError:  # a reader holds the log; it is checkpointed later
            pass
        self.db.close()
        self.db = None


def _stored_statistics(kinds: List[str], exact: Optional[np.ndarray]) -> List[tuple]:
    """The stored ``EXACT_COLUMNS`` of each row of ``EXACT_FIELDS`` (std: the population std of
    the finite values; None where not recorded or not finite), with the line of the kind when the
    recorder did not compute one: the std of values, the norm of parameter gradients (an update
    ratio that is not finite, of a weight whose norm is 0, stays empty)."""
    if exact is None or len(kinds) == 0:
        return [(None,) * len(EXACT_COLUMNS)] * len(kinds)
    rows = np.asarray(exact, float).reshape(len(kinds), -1)
    finite, mean, m2, lo, hi, nan, posinf, neginf, zeros, line = rows.T
    m2 = np.maximum(m2, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.where(finite > 0, np.sqrt(m2 / finite), np.nan)
        norm = np.where(finite > 0, np.sqrt(m2 + finite * mean * mean), np.nan)
    kind = np.asarray(kinds)
    fallback = np.where(kind == "params_grad", norm, std)
    line = np.where(np.isnan(line) & (kind != "updates"), fallback, line)  # an update ratio is never replaced
    table = np.stack([finite + nan + posinf + neginf, lo, hi, mean, std, nan, posinf, neginf, zeros, line], axis=1)
    table[~np.isfinite(finite)] = np.nan  # not recorded: every column empty
    return [tuple(r) for r in nullable(table)]


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
        raise PathNotWritableError(
            f"torchlens.train: cannot write the run folder {run_dir} ({error.strerror}). Pass a writable run_dir."
        ) from None
    return run_dir


__all__ = [
    "new_run_dir",
    "RunWriter",
    "TimelineRow",
    "connect",
    "DB_NAME",
    "FORMAT",
    "KINDS",
    "EXACT_COLUMNS",
    "HEARTBEAT_S",
]
