"""Reading a run: ``tl.open_run(run_dir)``. Works on a finished run and on one that a training
process is still writing; every property reads the database afresh."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ...arguments import (
    MissingPathError,
    require_bool,
    require_choice,
    require_float,
    require_instance,
    require_int,
    require_path,
    require_str,
)
from ...errors import TorchlensError
from ...web.stats import bin_edges
from ..model import Call
from .database import DB_NAME, EXACT_COLUMNS, FORMAT, KINDS, connect

NO_EXACT = "no exact statistics: this run was written before torchlens recorded them (the histograms are there)"
# what the line under each kind's strip shows
LINE_LABELS = {
    "io": "std",
    "params": "std",
    "io_grad": "median per-sample norm",
    "params_grad": "norm",
    "updates": "update ratio ||dw||/||w||",
}
STALE_AFTER_S = 60.0  # a 'running' run whose heartbeat is older is 'stopped' (the timer beats every 10 s)


class RunError(TorchlensError):
    """The folder is not a readable torchlens run."""


class UnknownSeriesError(TorchlensError, KeyError):
    """``run.series`` of a call, kind and name the run has no series of."""

    def __str__(self) -> str:  # KeyError's would print the message quoted
        return str(self.args[0]) if self.args else ""


_CALL_ID = "a call id such as '0:1' ('' for the model)"
_SINCE = (
    " AND last_step >= ? AND slot >= (SELECT MIN(ordinal) FROM steps WHERE step >= ?)"
    " / (SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'stride')"
)
INT64 = 2**63 - 1


@dataclass
class Series:
    """The histograms of one tensor over training: row ``i`` is column ``i`` of the heat strip.

    A column usually holds one logged step; in long runs older columns hold several
    (``steps[i]`` to ``last_steps[i]``, ``num_steps[i]`` of them).

    ``min``, ``max``, ``counts`` and ``nonfinite`` describe the histogram, drawn from a sample
    of the values with outliers rejected (``tl.watch``'s ``sample_n`` and
    ``reject_outlier_proportion``). The other arrays are over ALL values of the tensor in
    the column's steps: ``true_min``/``true_max`` (of the finite values), ``mean`` and ``std``
    (population std, ``correction=0``, of the finite values; mean and std of a float32
    tensor are good to float32 precision, about 1e-7 relative), the numbers of values ``count``, ``nan``,
    ``posinf``, ``neginf`` and ``zeros`` (exactly 0), and ``line``, the scalar drawn under the
    strip (``line_label``: std for ``io``/``params``, the median per-sample norm for
    ``io_grad``, the norm of the finite values for ``params_grad``, ``||dw|| / ||w||`` for
    ``updates``). For ``io_grad`` the values
    are the per-sample gradient norms, as in its histogram. A column holding several steps
    sums the counts, pools mean and std, and averages the line. All nan in runs written before
    these were recorded (``reason`` then says so).
    """

    call_id: str
    kind: str
    name: str
    steps: np.ndarray  # (n,) int64: first training step of each column
    last_steps: np.ndarray
    num_steps: np.ndarray
    bin_edges: np.ndarray  # (n, bins + 1)
    counts: np.ndarray  # (n, bins) float32
    min: np.ndarray  # (n,) smallest value kept (nan: no finite value)
    max: np.ndarray
    nonfinite: np.ndarray  # (n,) nan/inf values seen in the sample
    # why a series has no values (e.g. "no gradient: this call's output is not differentiable");
    # None once it has any, and in runs written before reasons were stored
    reason: Optional[str] = None
    true_min: np.ndarray = field(default_factory=lambda: np.zeros(0))
    true_max: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    std: np.ndarray = field(default_factory=lambda: np.zeros(0))
    count: np.ndarray = field(default_factory=lambda: np.zeros(0))
    nan: np.ndarray = field(default_factory=lambda: np.zeros(0))
    posinf: np.ndarray = field(default_factory=lambda: np.zeros(0))
    neginf: np.ndarray = field(default_factory=lambda: np.zeros(0))
    zeros: np.ndarray = field(default_factory=lambda: np.zeros(0))
    line: np.ndarray = field(default_factory=lambda: np.zeros(0))
    line_label: str = ""


class Run:
    """A run folder written by ``tl.watch``.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model = torch.nn.Linear(3, 2)
        >>> folder = tempfile.mkdtemp()
        >>> with tl.watch(model, run_dir=folder, backend=(), verbose=False):
        ...     for _ in range(3):
        ...         model(torch.rand(4, 3)).sum().backward()
        >>> run = tl.open_run(folder)
        >>> run.steps.tolist(), run.series('', 'params', 'weight').counts.sum(axis=1).tolist()
        ([0, 1, 2], [6.0, 6.0, 6.0])
    """

    def __init__(self, run_dir: str) -> None:
        self.run_dir = os.path.abspath(require_path("run_dir", run_dir, "tl.open_run"))
        if not os.path.isdir(self.run_dir):
            raise MissingPathError(f"torchlens: no run folder at {self.run_dir} (run_dir).")
        self.path = os.path.join(self.run_dir, DB_NAME)
        if not os.path.isfile(self.path):
            raise RunError(
                f"torchlens: {self.run_dir} is not a torchlens run (it has no {DB_NAME}). "
                "Pass the folder that tl.watch printed (w.run_dir)."
            )
        self._lock = threading.Lock()
        try:
            self._db = connect(self.path)
            meta = self._meta()
        except sqlite3.DatabaseError as error:
            raise RunError(f"torchlens: the run database {self.path} is corrupted or unreadable ({error}).") from None
        if meta.get("format") != FORMAT:
            raise RunError(
                f"torchlens: {self.path} is not a torchlens run database "
                f"(format {meta.get('format')!r}, expected {FORMAT!r})."
            )
        with self._damaged("its meta table"):
            self.model_name: str = str(meta.get("model", ""))
            self.options: dict = json.loads(meta.get("options", "{}"))
            if not isinstance(self.options, dict):
                raise ValueError(f"options is a {type(self.options).__name__}, not an object")
            # as recorded; each series' histograms have the size of their stored counts
            self.bins = int(meta["bins"])
            if self.bins < 1:
                raise ValueError(f"bins is {self.bins}")
        columns = [r[1] for r in self._query("PRAGMA table_info(series)")]
        self._has_reason = "reason" in columns  # runs written before have no reasons
        stored = [r[1] for r in self._query("PRAGMA table_info(columns)")]
        self._has_exact = "x_count" in stored  # nor exact statistics

    def _meta(self, wait: float = 5.0) -> dict:
        """The meta table; a database with no tables yet is a run being created: wait for it."""
        deadline = time.monotonic() + wait
        while True:
            tables = self._db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if tables or time.monotonic() > deadline:
                return dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            time.sleep(0.05)

    # ----- plumbing -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _damaged(self, what: str) -> Iterator[None]:
        """Values of a damaged database (a field edited, a row of the wrong type) are a
        ``RunError`` naming the database and ``what`` was being read, never a bare error."""
        try:
            yield
        except (KeyError, ValueError, TypeError, IndexError, OverflowError, AttributeError) as error:
            raise RunError(
                f"torchlens: the run database {self.path} is damaged: {what} cannot be read "
                f"({type(error).__name__}: {str(error)[:200]})."
            ) from None

    def _query(self, sql: str, args: tuple = ()) -> list:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.DatabaseError as error:
                raise RunError(f"torchlens: reading {self.path} failed: {error}") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<torchlens run of {self.model_name} at {self.run_dir}: {len(self.steps)} logged steps>"

    # ----- what is in it ------------------------------------------------------------------
    @property
    def status(self) -> str:
        """``'running'``, ``'finished'``, ``'failed'`` (training went on but a write failed, a full
        disk: steps are missing), or ``'stopped'``: the run was never closed and its writer is gone (its process has ended, on this machine, or its heartbeat is older than
        ``STALE_AFTER_S``). A run written by a torchlens without heartbeats stays ``'running'``."""
        meta = dict(self._query("SELECT key, value FROM meta WHERE key IN ('status', 'pid', 'host', 'heartbeat')"))
        status = str(meta.get("status", "running"))
        if status == "running" and _writer_gone(meta):
            return "stopped"
        return status

    @property
    def heartbeat(self) -> Optional[float]:
        """When the writer last showed it was alive (``time.time()``; None for runs written before
        heartbeats were recorded). Renewed at each logged step and every few seconds while the
        watch is open."""
        rows = self._query("SELECT value FROM meta WHERE key = 'heartbeat'")
        with self._damaged("the heartbeat"):
            return float(rows[0][0]) if rows else None

    @property
    def stride(self) -> int:
        """Logged steps per column in this run's newest columns (doubles as a run grows long)."""
        rows = self._query("SELECT value FROM meta WHERE key = 'stride'")
        with self._damaged("the stride"):
            return int(rows[0][0])

    @property
    def steps(self) -> np.ndarray:
        """The logged training steps, in order."""
        rows = self._query("SELECT step FROM steps ORDER BY ordinal")
        with self._damaged("the steps"):
            return np.array([r[0] for r in rows], dtype=np.int64)

    def steps_after(self, step: int) -> np.ndarray:
        """The logged steps after ``step``, in order (an index lookup: cheap however long the run)."""
        step = require_int("step", step, "run.steps_after", minimum=-INT64, maximum=INT64)
        rows = self._query("SELECT step FROM steps WHERE step > ? ORDER BY step", (step,))
        with self._damaged("the steps"):
            return np.array([r[0] for r in rows], dtype=np.int64)

    @property
    def step_count(self) -> Tuple[int, int]:
        """(how many logged steps, the last one or -1), read together: a live page takes its
        count from this, not from adding up the steps it was sent (answers can overlap)."""
        rows = self._query("SELECT count(*), max(step) FROM steps")
        with self._damaged("the steps"):
            return int(rows[0][0]), -1 if rows[0][1] is None else int(rows[0][1])

    @property
    def num_calls(self) -> int:
        """How many module calls the run has (without reading them)."""
        return int(self._query("SELECT count(*) FROM calls")[0][0])

    @property
    def calls(self) -> Dict[str, Call]:
        """Every module call, in call order; the model itself is ``''``."""
        rows = self._query("SELECT id, doc FROM calls ORDER BY ord")
        with self._damaged("the module calls"):
            return {cid: Call.from_dict(json.loads(doc)) for cid, doc in rows}

    def series_names(self, call_id: Optional[str] = None) -> List[Tuple[str, str, str]]:
        """``(call id, kind, name)`` of every series (of one call when given)."""
        if call_id is not None:
            require_instance("call_id", call_id, "run.series_names", str, takes=_CALL_ID)
        if call_id is None:
            rows = self._query("SELECT call_id, kind, name FROM series ORDER BY id")
        else:
            rows = self._query("SELECT call_id, kind, name FROM series WHERE call_id = ? ORDER BY id", (call_id,))
        return [tuple(r) for r in rows]

    def series(self, call_id: str, kind: str, name: str, since: Optional[int] = None) -> Series:
        """The histograms of one tensor; with ``since``, only columns that end at or after that
        step (what a live view needs to catch up)."""
        require_instance("call_id", call_id, "run.series", str, takes=_CALL_ID)
        require_choice("kind", kind, "run.series", KINDS)
        require_str("name", name, "run.series")
        require_int("since", since, "run.series", minimum=-INT64, maximum=INT64, optional=True)
        found = self._query(
            f"SELECT id, {'reason' if self._has_reason else 'NULL'} FROM series WHERE call_id = ? AND kind = ? AND name = ?",
            (call_id, kind, name),
        )
        if not found:
            raise UnknownSeriesError(self._unknown_series(call_id, kind, name))
        exact = ", ".join("x_" + _column(c) for c in EXACT_COLUMNS) if self._has_exact else "NULL"
        # since: the columns from the one holding the first step at or after it (a column's slot
        # is its first step's ordinal over the stride), found through the key (series, slot)
        sql = (
            f"SELECT step, last_step, num_steps, lo, hi, nonfinite, counts, {exact} FROM columns WHERE series_id = ?"
            + (_SINCE if since is not None else "")
            + " ORDER BY slot"
        )
        rows = self._query(sql, (found[0][0],) + ((int(since),) * 2 if since is not None else ()))
        with self._damaged(f"the series {call_id!r} {kind} {name!r}"):
            return self._series(call_id, kind, name, reason=found[0][1], rows=rows)

    def _series(self, call_id: str, kind: str, name: str, reason: Optional[str], rows: list) -> Series:
        n = len(rows)
        blobs = [r[6] for r in rows]
        if not all(isinstance(b, bytes) and len(b) == len(blobs[0]) and len(b) % 4 == 0 for b in blobs):
            raise ValueError("its stored histograms are not all of one size")
        # the size of what is stored, not the number in meta (no rows: empty arrays cost nothing)
        bins = len(blobs[0]) // 4 if blobs else self.bins
        lo = np.array([np.nan if r[3] is None else r[3] for r in rows], dtype=np.float64)
        hi = np.array([np.nan if r[4] is None else r[4] for r in rows], dtype=np.float64)
        counts = np.stack([np.frombuffer(b, np.float32) for b in blobs]) if n else np.zeros((0, bins), np.float32)
        stats = {
            name: np.array([np.nan if r[7 + k] is None else r[7 + k] for r in rows], dtype=np.float64)
            if self._has_exact
            else np.full(n, np.nan)
            for k, name in enumerate(EXACT_COLUMNS)
        }
        if not self._has_exact and reason is None:
            reason = NO_EXACT
        return Series(
            call_id,
            kind,
            name,
            steps=np.array([r[0] for r in rows], np.int64),
            last_steps=np.array([r[1] for r in rows], np.int64),
            num_steps=np.array([r[2] for r in rows], np.int64),
            bin_edges=bin_edges(lo, hi, bins) if n else np.zeros((0, bins + 1)),
            counts=counts,
            min=lo,
            max=hi,
            nonfinite=np.array([r[5] for r in rows], np.int64),
            reason=reason,
            line_label=LINE_LABELS.get(kind, ""),
            **stats,
        )

    def health(self) -> Any:
        """What looks wrong (NaN, exploding/vanishing gradients, dead or saturated units, update
        sizes), one row per (call, series, signal), worst first: a pandas DataFrame
        (``torchlens.train.health.report``, where the signals and thresholds are described)."""
        from ..health import health

        return health(self)

    def export(self, path: str, format: Optional[str] = None, overwrite: bool = False) -> str:
        """Write this run's series as one long table (``format="parquet"``, the default for a
        ``.parquet`` path): a row per series and column, with step, call, kind, name, the exact
        statistics and the histogram (``torchlens.train.store.export``). Needs pyarrow. An
        existing file is replaced only with ``overwrite=True``. Returns ``path``."""
        from .export import export_run

        path = require_path("path", path, "run.export", new=True)
        require_str("format", format, "run.export", optional=True)  # known formats: export_run says
        require_bool("overwrite", overwrite, "run.export")
        return export_run(self, path, format=format, overwrite=overwrite)

    def compare(self, other: "Run", tolerance: float = 0.1) -> list:
        """Per series, the first logged step where this run's distribution and ``other``'s
        differ: a list of ``SeriesComparison`` (``torchlens.train.store.compare``, where the distance
        and the tolerance are described): their exact statistics differ beyond float rounding,
        or their histograms by more than ``tolerance``; series only one run has say which.

        Example:
            >>> import tempfile, torch, torchlens as tl
            >>> runs = []
            >>> for scale in (1.0, 10.0):
            ...     _ = torch.manual_seed(0)  # the same weights and data: only the scale differs
            ...     model, folder = torch.nn.Linear(3, 2), tempfile.mkdtemp()
            ...     with tl.watch(model, run_dir=folder, backend=(), verbose=False, log=("io",)):
            ...         for step in range(3):
            ...             _ = model(torch.rand(50, 3) * (scale if step == 2 else 1.0))
            ...     runs.append(tl.open_run(folder))
            >>> [(c.name, c.first_step) for c in runs[0].compare(runs[1]) if c.name == "input 0"]
            [('input 0', 2)]
        """
        from .compare import compare_runs

        require_instance("other", other, "run.compare", Run, takes="another Run (tl.open_run(folder))")
        require_float("tolerance", tolerance, "run.compare", minimum=0.0, below=1.0)
        return compare_runs(self, other, tolerance=tolerance)

    def _unknown_series(self, call_id: str, kind: str, name: str) -> str:
        names = self.series_names()
        calls = sorted({c for c, _, _ in names})
        if call_id not in calls:
            close = difflib.get_close_matches(call_id, calls, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            return f"no call {call_id!r} (call_id) has series in this run.{hint} Calls are listed in run.calls."
        here = [f"{k}/{n}" for c, k, n in names if c == call_id]
        return f"call {call_id!r} has no {kind} series of the name {name!r}; it has: {', '.join(here)}."


def _column(name: str) -> str:
    """The table's column of an ``EXACT_COLUMNS`` name (x_min for true_min)."""
    return name.replace("true_", "")


def _writer_gone(meta: dict) -> bool:
    """Whether the process that writes a 'running' run has certainly stopped."""
    try:
        heartbeat: Optional[float] = float(meta["heartbeat"]) if meta.get("heartbeat") is not None else None
    except (TypeError, ValueError):
        heartbeat = 0.0  # damaged: no sign of life
    if heartbeat is not None and time.time() - heartbeat > STALE_AFTER_S:
        return True  # a live writer renews it every few seconds (a stopped or reused pid does not)
    pid, host = meta.get("pid"), meta.get("host")
    if pid is None or host != socket.gethostname() or os.name != "posix":
        return False  # another machine's process (or no signal 0 to ask with): only the heartbeat tells
    try:
        os.kill(int(pid), 0)  # signal 0: is there such a process?
    except ProcessLookupError:
        return True
    except (PermissionError, OSError, ValueError):  # it exists (another user's), or cannot tell
        return False
    try:  # Linux: a killed process its parent has not reaped yet is a zombie
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rpartition(")")[2].split()[:1] == ["Z"]
    except OSError:
        return False


def find_runs(root: str) -> List[str]:
    """The runs under ``root``, as paths relative to it: ``['.']`` when ``root`` is a run, else
    every folder below it (to three levels) that holds a run database, in name order."""
    root = os.path.abspath(root)
    if os.path.isfile(os.path.join(root, DB_NAME)):
        return ["."]
    found = []
    base_depth = root.rstrip(os.sep).count(os.sep)
    for folder, subfolders, files in os.walk(root):
        if DB_NAME in files:
            found.append(os.path.relpath(folder, root))
            subfolders[:] = []
        elif folder.count(os.sep) - base_depth >= 3:
            subfolders[:] = []
        subfolders.sort()
    return sorted(found)


def open_run(run_dir: str) -> Run:
    """Open a run folder written by ``tl.watch`` (also while training still writes it).

    Raises ``FileNotFoundError`` for a missing folder and ``RunError`` for a folder that is not a
    run or whose database is corrupted.
    """
    return Run(run_dir)


__all__ = ["open_run", "find_runs", "Run", "Series", "RunError"]
