"""``tl.watch`` across real processes: a reader following a run that another process writes, a
writer killed with SIGKILL, DistributedDataParallel on two CPU processes (gloo), and training
in a fresh process with and without a watch.

Every helper script is written to ``tmp_path`` and run with this interpreter; nothing is mocked.
"""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import torchlens as tl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MLP_CALLS = ["", "0:1", "1:1", "2:1"]
# the series of Sequential(Linear, activation, Linear) fed a tensor that needs no gradient (with
# input_grads=True it gets a gradient strip all the same, through an alias that requires grad)
MLP_SERIES = sorted(
    [(c, "io", n) for c in MLP_CALLS for n in ("input 0", "output 0")]
    + [(c, "io_grad", n) for c in MLP_CALLS for n in ("input 0", "output 0")]  # the data's too
    + [(c, k, n) for c in ("0:1", "2:1") for k in ("params", "params_grad") for n in ("weight", "bias")]
)

# Child processes: one intra-op thread each (two processes share two cores), and the working
# tree's torchlens first on the path.
_PRELUDE = textwrap.dedent(f"""
    import os, sys, time, json
    sys.path.insert(0, {REPO!r})
    import torch
    torch.set_num_threads(1)
""")


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(_PRELUDE + textwrap.dedent(body))
    return str(path)


def _start(script, *args, **env):
    return subprocess.Popen(
        [sys.executable, script, *map(str, args)],
        cwd=REPO,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(proc):
    """Kill a child that is still running and collect its output (for failure messages)."""
    if proc.poll() is None:
        proc.kill()
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        out, err = "", "(no output: the child did not end after SIGKILL)"
    return out, err


def _open_when_ready(run_dir, proc, timeout):
    """``tl.open_run`` as soon as the child has created its run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = _stop(proc)
            pytest.fail(f"the training child ended early (rc {proc.returncode}):\n{out}\n{err}")
        if os.path.isfile(os.path.join(run_dir, "run.db")):
            try:
                return tl.open_run(run_dir)
            except tl.RunError:  # the writer is between creating the file and writing its meta rows
                pass
        time.sleep(0.05)
    out, err = _stop(proc)
    pytest.fail(f"no readable run in {run_dir} after {timeout} s:\n{out}\n{err}")


def _assert_consecutive(steps):
    steps = list(np.asarray(steps).tolist())
    assert steps == list(range(len(steps))), steps


# --------------------------------------------------------------------------------------------
# 1. a reader follows a run while another process writes it
# --------------------------------------------------------------------------------------------
_LIVE_CHILD = """
    import torchlens as tl
    run_dir, num_steps, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = tl.watch(model, log_freq=1, backend=None, run_dir=run_dir, verbose=False, input_grads=True)
    for step in range(num_steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        time.sleep(pause)
    before = w.steps_logged  # each step is written when its backward ends: all of them by now
    w.close()
    print("done", before, flush=True)
"""


def test_live_reader_follows_a_training_process(tmp_path):
    num_steps = 200
    run_dir = str(tmp_path / "run")
    proc = _start(_script(tmp_path, "live.py", _LIVE_CHILD), run_dir, num_steps, 0.02)
    try:
        run = _open_when_ready(run_dir, proc, timeout=120)
        seen = []  # step counts read while the run said 'running'
        mid_series = None
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            steps = run.steps
            status = run.status  # read second: these steps were read before the run finished
            if status == "running":
                _assert_consecutive(steps)
                if len(steps) and (not seen or seen[-1] != len(steps)):
                    seen.append(len(steps))
                if len(steps) >= 2 and mid_series is None:
                    # read every series of the run while it is being written
                    mid_series = {}
                    for key in run.series_names():
                        s = run.series(*key)
                        mid_series[key] = s
                        assert len(s.steps) >= len(steps)  # more may have been written meanwhile
                        _assert_consecutive(s.steps)
                        assert s.counts.shape == (len(s.steps), run.bins)
                        assert s.bin_edges.shape == (len(s.steps), run.bins + 1)
                        assert (s.counts.sum(axis=1) > 0).all(), key
            time.sleep(0.05)
        out, err = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode == 0, err
    assert out.split() == ["done", str(num_steps)]

    partial = [n for n in seen if 0 < n < num_steps]
    assert len(set(partial)) >= 2, f"the reader saw no growth while the run was running: {seen}"
    assert seen == sorted(seen), seen  # never shrinks
    assert mid_series is not None and sorted(mid_series) == MLP_SERIES

    # the same Run object, opened mid-run, sees the finished run
    assert run.status == "finished"
    assert run.steps.tolist() == list(range(num_steps))
    assert list(run.calls) == MLP_CALLS
    names = run.series_names()
    assert sorted(names) == MLP_SERIES
    for key in names:
        s = run.series(*key)
        assert s.steps.tolist() == list(range(num_steps)), key
        # what was read mid-run is unchanged at the end (columns are appended, not rewritten)
        early = mid_series[key]
        n = len(early.steps)
        assert np.array_equal(s.counts[:n], early.counts), key
        assert np.array_equal(s.min[:n], early.min, equal_nan=True), key
        assert np.array_equal(s.max[:n], early.max, equal_nan=True), key
    weight = run.series("0:1", "params", "weight")
    assert (weight.counts.sum(axis=1) == weight.counts.sum(axis=1)[0]).all()
    run.close()
    # a fresh reader agrees
    with tl.open_run(run_dir) as again:
        assert again.status == "finished"
        assert again.steps.tolist() == list(range(num_steps))


# --------------------------------------------------------------------------------------------
# 2. the writer is killed with SIGKILL
# --------------------------------------------------------------------------------------------
_KILLED_CHILD = """
    import torchlens as tl
    run_dir = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = tl.watch(model, log_freq=1, backend=None, run_dir=run_dir, verbose=False, input_grads=True)
    for step in range(100000):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        print("step", step, flush=True)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("printed", [5, 40])
def test_sigkill_of_the_writer_leaves_a_readable_run(tmp_path, printed):
    run_dir = str(tmp_path / "run")
    proc = _start(_script(tmp_path, "killed.py", _KILLED_CHILD), run_dir)
    lines = []
    try:
        deadline = time.monotonic() + 120
        while len(lines) < printed:
            line = proc.stdout.readline()
            if not line:
                out, err = _stop(proc)
                pytest.fail(f"the child ended (rc {proc.returncode}) after {len(lines)} steps:\n{err}")
            lines.append(line.split())
            assert time.monotonic() < deadline, f"only {len(lines)} steps in 120 s"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        _stop(proc)
    assert proc.returncode == -signal.SIGKILL
    assert lines == [["step", str(i)] for i in range(printed)]

    path = os.path.join(run_dir, "run.db")
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        raw.close()

    with tl.open_run(run_dir) as run:
        assert run.status == "stopped"  # never closed, and its process is gone
        steps = run.steps.tolist()
        # step i is handed to the writer thread when its backward ends, and the writer lags by two
        # writes at most: after 'step k' was printed, step k - 2 is in the database
        assert steps == list(range(len(steps)))
        assert steps[-1] >= printed - 3, (steps[-1], printed)
        last = steps[-1]
        assert list(run.calls) == MLP_CALLS
        names = run.series_names()
        assert sorted(names) == MLP_SERIES
        for key in names:
            s = run.series(*key)
            # every series has a column for every committed step, the last one included
            assert s.steps.tolist() == steps, key
            assert s.last_steps[-1] == last
            assert s.counts.shape == (len(steps), run.bins)
            assert np.isfinite(s.counts).all() and (s.counts.sum(axis=1) > 0).all(), key


_IDLE_CHILD = """
    import torchlens as tl
    import torchlens.train.store.database as store
    store.HEARTBEAT_S = 0.2  # the timer's period (10 s by default), short for the test
    run_dir = sys.argv[1]
    model = torch.nn.Linear(4, 2)
    w = tl.watch(model, log_freq=1, backend=None, run_dir=run_dir, verbose=False, input_grads=True)
    for step in range(2):
        model(torch.randn(3, 4)).sum().backward()
    w.flush()
    print("idle", flush=True)
    time.sleep(600)  # a watch left open while nothing trains (a long evaluation, a debugger)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_an_idle_watch_is_running_until_its_process_is_killed(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = _start(_script(tmp_path, "idle.py", _IDLE_CHILD), run_dir)
    try:
        line = proc.stdout.readline()
        if line.strip() != "idle":
            out, err = _stop(proc)
            pytest.fail(f"the child ended (rc {proc.returncode}):\n{line}{out}\n{err}")
        with tl.open_run(run_dir) as run:
            first = run.heartbeat
            time.sleep(1.0)
            assert run.heartbeat > first  # the timer beats while no step is logged
            assert run.status == "running"
            os.kill(proc.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10  # not reaped yet: a zombie is not a live writer either
            while run.status != "stopped" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert run.status == "stopped"  # the same open reader sees it
            proc.wait(timeout=30)
            assert run.status == "stopped"
    finally:
        _stop(proc)
    with tl.open_run(run_dir) as run:
        assert run.status == "stopped" and run.steps.tolist() == [0, 1]


def _edit_meta(run_dir, **values):
    db = sqlite3.connect(os.path.join(run_dir, "run.db"))
    with db:
        for key, value in values.items():
            if value is None:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))
    db.close()


def test_a_run_of_another_host_is_stopped_when_its_heartbeat_is_old(tmp_path):
    from torchlens.train.store.reader import STALE_AFTER_S

    run_dir = str(tmp_path / "run")
    model = torch.nn.Linear(4, 2)
    with tl.watch(model, backend=None, run_dir=run_dir, verbose=False):
        model(torch.randn(3, 4)).sum().backward()
    # as if a process on another machine were still writing it (a shared file system)
    _edit_meta(run_dir, status="running", host="some-other-machine", pid=1, heartbeat=time.time())
    with tl.open_run(run_dir) as run:
        assert run.status == "running"
    _edit_meta(run_dir, heartbeat=time.time() - STALE_AFTER_S - 5)
    with tl.open_run(run_dir) as run:
        assert run.status == "stopped"
    # a run written before heartbeats were recorded: readable, and nothing says it stopped
    _edit_meta(run_dir, host=None, pid=None, heartbeat=None)
    with tl.open_run(run_dir) as run:
        assert run.status == "running" and run.heartbeat is None and run.steps.tolist() == [0]


# --------------------------------------------------------------------------------------------
# 3. DistributedDataParallel on two CPU processes
# --------------------------------------------------------------------------------------------
_DDP_CHILD = """
    from datetime import timedelta
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    import torchlens as tl
    run_dir, out_file, num_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    torch.manual_seed(1234 + rank)  # different initial weights: DDP must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    w = tl.watch(ddp, log_freq=1, backend=None, run_dir=run_dir, verbose=False, sample_n=None,
                 reject_outlier_proportion=0.0)
    g = torch.Generator().manual_seed(99)
    losses, grads = [], []
    for step in range(num_steps):
        xs = torch.randn(2, 5, 6, generator=g)  # both ranks draw both batches, use their own
        x = xs[rank]
        opt.zero_grad()
        loss = ddp(x).pow(2).mean()
        loss.backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})  # averaged by DDP
        opt.step()
        losses.append(loss.item())
    w.close()
    torch.save({"params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "losses": losses, "grads": grads, "watch_run_dir": w.run_dir,
                "watch_type": type(w).__name__}, out_file)
    dist.barrier()
    dist.destroy_process_group()
"""


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="needs torch.distributed with gloo",
)
def test_ddp_two_processes_only_rank0_records(tmp_path):
    num_steps = 6
    script = _script(tmp_path, "ddp.py", _DDP_CHILD)
    port = _free_port()
    procs = []
    try:
        for rank in range(2):
            env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE=2, LOCAL_RANK=rank)
            if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in os.environ:
                env["GLOO_SOCKET_IFNAME"] = "lo"
            procs.append(_start(script, tmp_path / f"run{rank}", tmp_path / f"out{rank}.pt", num_steps, **env))
        results = []
        deadline = time.monotonic() + 150
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                out, err = _stop(proc)
                pytest.fail(f"a DDP rank did not finish in time:\n{out}\n{err}")
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            _stop(proc)
    for rank, (rc, out, err) in enumerate(results):
        assert rc == 0, f"rank {rank} failed:\n{out}\n{err}"

    r0, r1 = (torch.load(tmp_path / f"out{rank}.pt") for rank in range(2))
    # rank 0 writes the run; rank 1 records and sends its counts to rank 0 (no folder of its own)
    assert r0["watch_type"] == "Watch"
    assert r0["watch_run_dir"] == str(tmp_path / "run0")
    assert r1["watch_run_dir"] is None
    assert not os.path.exists(tmp_path / "run1" / "run.db")

    with tl.open_run(tmp_path / "run0") as run:
        assert run.status == "finished"
        assert run.steps.tolist() == list(range(num_steps))
        assert run.model_name == "Sequential"
        # the calls of the wrapped model, addressed without DDP's 'module.' prefix
        assert list(run.calls) == MLP_CALLS
        assert [c.class_name for c in run.calls.values()] == ["Sequential", "Linear", "Tanh", "Linear"]
        assert run.series("0:1", "params", "weight").steps.tolist() == list(range(num_steps))
        grad = run.series("2:1", "params_grad", "bias")
        assert grad.steps.tolist() == list(range(num_steps)) and (grad.counts.sum(axis=1) == 3).all()
        # params_grad is the .grad that backward left, after DDP's all-reduce, not the rank's own
        for name in r0["grads"][0]:
            address, param = name.split(".")
            s = run.series(f"{address}:1", "params_grad", param)
            for step, grads in enumerate(r0["grads"]):
                g, on_rank1 = grads[name], r1["grads"][step][name]
                assert torch.equal(g, on_rank1), (name, step)  # the two ranks agree on the average
                assert s.counts[step].sum() == g.numel()
                assert (s.min[step], s.max[step]) == pytest.approx(
                    (g.min().item(), g.max().item()), rel=1e-6, abs=1e-9
                ), (name, step)

    # DDP kept both replicas identical: watching rank 0 disturbed neither the gradients'
    # all-reduce nor the parameters
    assert r0["params"].keys() == r1["params"].keys()
    for k in r0["params"]:
        assert torch.equal(r0["params"][k], r1["params"][k]), k
    assert r0["losses"] != r1["losses"]  # the ranks did see different data

    # the same training in one process, averaging the two ranks' losses, gives the same weights
    torch.manual_seed(1234)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(99)
    for _ in range(num_steps):
        xs = torch.randn(2, 5, 6, generator=g)
        opt.zero_grad()
        ((ref(xs[0]).pow(2).mean() + ref(xs[1]).pow(2).mean()) / 2).backward()
        opt.step()
    for k, v in ref.state_dict().items():
        assert torch.allclose(r0["params"][k], v, rtol=1e-5, atol=1e-6), k


# --------------------------------------------------------------------------------------------
# 4. a fresh process trains bit for bit the same with and without a watch
# --------------------------------------------------------------------------------------------
_FRESH_CHILD = """
    mode, out_file = sys.argv[1], sys.argv[2]
    torch.manual_seed(7)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True),
        torch.nn.Dropout(0.3), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if mode == "watch":  # torchlens is imported only here: the plain run never sees it
        import torchlens as tl
        w = tl.watch(model, log_freq=2, backend=None, run_dir=sys.argv[3], verbose=False)
    losses = []
    for step in range(8):
        x = torch.randn(4, 3, 6, 6)
        y = torch.randint(5, (4,))
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        final = model(torch.randn(2, 3, 6, 6))
    if mode == "watch":
        w.close()
    torch.save({"state": model.state_dict(), "losses": losses, "eval": final,
                "rng": torch.get_rng_state()}, out_file)
"""


def test_fresh_process_trains_identically_with_and_without_watch(tmp_path):
    """Two fresh interpreters, one never importing torchlens: same losses, weights, BatchNorm
    statistics, evaluation output and global random state, with logged and unlogged steps."""
    script = _script(tmp_path, "fresh.py", _FRESH_CHILD)
    procs = [
        _start(script, "plain", tmp_path / "plain.pt"),
        _start(script, "watch", tmp_path / "watch.pt", tmp_path / "run"),
    ]
    try:
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            _stop(p)
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    plain, watched = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "watch.pt")
    assert plain["losses"] == watched["losses"]
    assert torch.equal(plain["rng"], watched["rng"])  # the watch drew nothing from torch's generator
    assert torch.equal(plain["eval"], watched["eval"])
    assert plain["state"].keys() == watched["state"].keys()
    for k in plain["state"]:
        assert torch.equal(plain["state"][k], watched["state"][k]), k  # BatchNorm statistics too
    with tl.open_run(tmp_path / "run") as run:
        assert run.status == "finished"
        assert run.steps.tolist() == [0, 2, 4, 6]
        assert "1:1" in run.calls and run.calls["1:1"].class_name == "BatchNorm2d"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_waits_for_the_writes_under_way(tmp_path, monkeypatch):
    """A DataLoader forks its workers while training runs: the writer thread must not be caught
    in the middle of a write (the child would inherit the locks it held)."""
    from torchlens.train.step import StepWriter

    write = StepWriter._write

    def slow_write(self, *args, **kwargs):
        time.sleep(0.5)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(StepWriter, "_write", slow_write)
    model = torch.nn.Linear(3, 2)
    w = tl.watch(model, run_dir=str(tmp_path / "run"), backend=None, verbose=False, log=("params_grad",))
    try:
        model(torch.randn(4, 3)).sum().backward()  # its write is handed over, and sleeps
        # the write (it sleeps), and maybe the job queued before it (binning ahead, a checkpoint)
        assert w._steps._jobs.unfinished_tasks >= 1
        pid = os.fork()
        if pid == 0:  # the child leaves at once, touching nothing
            os._exit(0)
        assert w._steps._jobs.unfinished_tasks == 0  # the fork waited for the write
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        w.close()
