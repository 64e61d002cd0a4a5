"""The run on disk: one SQLite database per run folder, written while training (``database``:
``RunWriter``) and read at the same time (``reader``: ``tl.open_run``); a run's exports
(``export``: Parquet, CSV; ``chrome_trace``: the step timeline for Perfetto), the runs under a
folder and SQL over them (``query``: ``torchlens runs``), and two runs compared (``compare``).

Example:
    >>> import tempfile
    >>> from torchlens.train.store import find_runs
    >>> find_runs(tempfile.mkdtemp())
    []
"""

from .chrome_trace import read_timeline
from .compare import TOLERANCE, compare_runs
from .database import DB_NAME, EXACT_COLUMNS, KINDS, RunWriter, TimelineRow, connect, new_run_dir
from .export import RunExportError, RunExportExistsError, export_run, run_table
from .query import RunQueryError, list_runs, query_runs, runs_main
from .reader import Run, RunError, Series, find_runs, open_run

__all__ = [
    "open_run",
    "find_runs",
    "Run",
    "RunError",
    "Series",
    "RunWriter",
    "new_run_dir",
    "connect",
    "DB_NAME",
    "KINDS",
    "EXACT_COLUMNS",
    "TimelineRow",
    "read_timeline",
    "export_run",
    "run_table",
    "RunExportError",
    "RunExportExistsError",
    "list_runs",
    "query_runs",
    "runs_main",
    "RunQueryError",
    "compare_runs",
    "TOLERANCE",
]
