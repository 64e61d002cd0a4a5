"""A watched training killed (``kill -9``) or out of disk: the run keeps every step that finished
and says how it ended (issue 41)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import torchlens as tl

_TRAIN = """
import sys, torch, torchlens as tl
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
kwargs = {"optimizer": opt} if sys.argv[2] == "known" else {}
w = tl.watch(model, run_dir=sys.argv[1], backend=None, verbose=False, **kwargs)
for step in range(100000):
    loss = model(torch.rand(16, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, flush=True)  # the loop's own log: this step's backward and optimizer step are done
"""


def _train_and_kill(run_dir: str, after_lines: int, delay: float, optimizer: str) -> int:
    """Start a watched training, kill it with SIGKILL ``delay`` s after it logged
    ``after_lines`` steps; the number of steps it logged as finished."""
    child = subprocess.Popen(
        [sys.executable, "-c", _TRAIN, run_dir, optimizer], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    finished = -1
    try:
        assert child.stdout is not None
        for line in child.stdout:
            finished = int(line)
            if finished + 1 >= after_lines:
                break
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        rest, errors = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL, errors[-2000:]
    lines = [int(n) for n in rest.split()]
    return (lines[-1] if lines else finished) + 1


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["known", "unknown"])
def test_kill_9_keeps_every_finished_step(tmp_path, optimizer):
    """The loop prints a step after opt.step(); a kill at any moment may lose only the step in
    flight (it lost 1-2 finished steps when the writer's queue still held them)."""
    moments = [(3, 0.0), (5, 0.003), (8, 0.011), (13, 0.029), (21, 0.047), (6, 0.0), (9, 0.017)]
    missing = []
    for k, (after, delay) in enumerate(moments):
        run_dir = str(tmp_path / f"run{k}")
        finished = _train_and_kill(run_dir, after, delay, optimizer)
        run = tl.open_run(run_dir)
        stored = set(run.steps)
        lost = [s for s in range(finished) if s not in stored]
        if lost:
            missing.append((after, delay, finished, lost))
        assert run.status == "stopped"
    assert not missing, f"finished steps missing from the run (after, delay, finished, lost): {missing}"


_FULL_DISK = """
import resource, signal, sys, torch, torchlens as tl
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
w = tl.watch(model, run_dir=sys.argv[1], backend=None, verbose=False, optimizer=opt)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
import os
size = os.path.getsize(os.path.join(sys.argv[1], "run.db")) + os.path.getsize(os.path.join(sys.argv[1], "run.db-wal"))
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 400_000, resource.RLIM_INFINITY))
done = 0
try:
    for step in range(10000):
        loss = model(torch.rand(8, 64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        done = step + 1
finally:
    print("finished", done, flush=True)
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    try:
        w.close()
    except Exception:
        pass
"""


def test_a_full_disk_stops_training_and_the_run_says_it_failed(tmp_path):
    run_dir = str(tmp_path / "run")
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, run_dir], capture_output=True, text=True, timeout=600)
    assert "writing a logged step to the run failed" in done.stderr, done.stderr[-3000:]
    finished = int(done.stdout.split()[-1])
    run = tl.open_run(run_dir)
    assert run.status in ("failed", "stopped"), run.status
    stored = set(run.steps)
    assert all(s in stored for s in range(finished)), (finished, sorted(stored)[-5:])


# ----- damaged run databases: a RunError naming the problem, never a bare error ----------------
def _small_run(tmp_path, name: str = "run") -> str:
    import torch

    model = torch.nn.Linear(3, 2)
    folder = str(tmp_path / name)
    with tl.watch(model, run_dir=folder, backend=None, verbose=False):
        for _ in range(3):
            model(torch.rand(4, 3)).sum().backward()
    return folder


def _edit(folder: str, sql: str, args: tuple = ()) -> None:
    import sqlite3

    db = sqlite3.connect(os.path.join(folder, "run.db"))
    with db:
        db.execute(sql, args)
    db.close()


@pytest.mark.parametrize(
    "key,value",
    [("options", "{"), ("options", "[1]"), ("bins", "many"), ("bins", "-3"), ("model", None)],
)
def test_damaged_meta_is_a_run_error(tmp_path, key, value):
    folder = _small_run(tmp_path)
    if value is None:
        _edit(folder, "DELETE FROM meta WHERE key = 'bins'")
    else:
        _edit(folder, "UPDATE meta SET value = ? WHERE key = ?", (value, key))
    with pytest.raises(tl.RunError, match="damaged"):
        tl.open_run(folder)


def _run_error():
    from torchlens.train.store.reader import RunError

    return RunError


@pytest.mark.parametrize(
    "sql,read",
    [
        ("UPDATE meta SET value = 'x' WHERE key = 'stride'", lambda run: run.stride),
        ("UPDATE calls SET doc = '{'", lambda run: run.calls),
        ("UPDATE calls SET doc = '[]'", lambda run: run.calls),
        ("UPDATE columns SET lo = 'x'", lambda run: run.series("", "params", "weight")),
        ("UPDATE columns SET counts = x'00'", lambda run: run.series("", "params", "weight")),
        ("UPDATE columns SET step = 'x'", lambda run: run.series("", "params", "weight")),
        ("UPDATE meta SET value = 'soon' WHERE key = 'heartbeat'", lambda run: run.heartbeat),
    ],
)
def test_damaged_tables_are_a_run_error(tmp_path, sql, read):
    folder = _small_run(tmp_path)
    _edit(folder, sql)
    run = tl.open_run(folder)
    with pytest.raises(_run_error(), match="damaged"):
        read(run)


def test_a_damaged_heartbeat_reads_as_stopped_not_an_error(tmp_path):
    folder = _small_run(tmp_path)
    _edit(folder, "UPDATE meta SET value = 'running' WHERE key = 'status'")
    _edit(folder, "UPDATE meta SET value = 'soon' WHERE key = 'heartbeat'")
    assert tl.open_run(folder).status == "stopped"


def test_histogram_sizes_follow_the_stored_counts_not_meta(tmp_path):
    """meta.bins = 200000000 made one series() allocate 11 GB."""
    import resource

    folder = _small_run(tmp_path)
    bins = tl.open_run(folder).bins
    _edit(folder, "UPDATE meta SET value = '200000000' WHERE key = 'bins'")
    run = tl.open_run(folder)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    series = run.series("", "params", "weight")
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 100 << 20
    assert series.counts.shape == (3, bins) and series.bin_edges.shape == (3, bins + 1)


def test_one_damaged_run_does_not_hide_the_others(tmp_path):
    from torchlens.train.serve.data import Catalog

    good = _small_run(tmp_path, "good")
    bad = _small_run(tmp_path, "bad")
    _edit(bad, "UPDATE meta SET value = '{' WHERE key = 'options'")
    runs = {r["id"]: r for r in Catalog(str(tmp_path)).runs_json()["runs"]}
    assert runs["good"]["steps"] == 3 and "error" not in runs["good"], runs
    assert "damaged" in runs["bad"]["error"], runs
    assert good


def test_the_run_log_stays_bounded_without_the_checkpoints_of_idle_moments(tmp_path):
    import numpy as np

    from torchlens.train.store import RunWriter
    from torchlens.train.store.database import CHECKPOINT_PAGES

    bins = 32
    writer = RunWriter(str(tmp_path / "run"), "M", {}, bins)
    keys = [(f"m{i}:1", "io", "output 0") for i in range(300)]  # a page per series: a large log per step
    n = len(keys)
    wal = os.path.join(str(tmp_path / "run"), "run.db-wal")
    sizes = []
    for step in range(200):
        writer.write_step(step, keys, np.ones((n, bins)), np.zeros(n), hi=np.ones(n), nonfinite=np.zeros(n))
        sizes.append(os.path.getsize(wal))
    writer.close()
    # sqlite's own checkpoint, past 4 * CHECKPOINT_PAGES pages, starts the log over: it stops growing
    frame = 4096 + 24
    assert sizes[-1] == sizes[-40], f"the log grew with the steps: {sizes[-40]} then {sizes[-1]} bytes"
    assert sizes[-1] <= (4 * CHECKPOINT_PAGES + n) * frame
    run = tl.open_run(str(tmp_path / "run"))
    assert run.series(*keys[-1]).steps.tolist()[-1] == 199
    run.close()


def test_a_step_appends_about_its_own_rows_to_the_log(tmp_path):
    """A step's rows (one per series) are written side by side: its commit logs well under a
    page per series (in key order, each row split its series' full page: about three pages a
    row, and the log's automatic checkpoint ran inside nearly every durable commit)."""
    import numpy as np

    from torchlens.train.store import RunWriter

    bins = 64
    writer = RunWriter(str(tmp_path / "run"), "M", {}, bins)
    keys = [(f"m{i}:1", "io", "output 0") for i in range(300)]
    n = len(keys)
    wal = os.path.join(str(tmp_path / "run"), "run.db-wal")
    for step in range(100):
        writer.write_step(step, keys, np.ones((n, bins)), np.zeros(n), hi=np.ones(n), nonfinite=np.zeros(n))
    writer.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = os.path.getsize(wal)
    writer.write_step(100, keys, np.ones((n, bins)), np.zeros(n), hi=np.ones(n), nonfinite=np.zeros(n))
    pages = (os.path.getsize(wal) - before) / (writer.db.execute("PRAGMA page_size").fetchone()[0] + 24)
    writer.close()
    assert pages < n, f"one step logged {pages:.0f} pages for {n} series"
    run = tl.open_run(str(tmp_path / "run"))
    assert run.series(*keys[-1]).steps.tolist()[-5:] == [96, 97, 98, 99, 100]
    run.close()
