"""tl.watch on compiled models: torch.compile(model), model.compile() after watching, compiled
submodules, fullgraph=True (torchlens/train/model/compiled.py).

The tests compile with the ``aot_eager`` backend: Dynamo (graph capture, guards, graph breaks,
recompiles, the hooks' fate) behaves as with inductor, without inductor's slow C++ builds.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import torchlens as tl

dynamo = pytest.importorskip("torch._dynamo")
from torchlens.train.model.compiled import dynamo_counts  # noqa: E402

BACKEND = "aot_eager"


@pytest.fixture(autouse=True)
def dynamo_as_new():
    """Dynamo's caches, counters and stance as in a fresh process, so the counts below are
    exact whatever ran before."""
    dynamo.reset()
    torch.compiler.set_stance("default")
    yield


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 2))


def _train(target: nn.Module, run_dir: str, steps: int = 5, compile_in_place=None) -> tuple:
    """Watch ``target`` (log_freq=2; the data's gradient too, so its alias meets the compiled
    model), optionally ``.compile()`` a module after watching, run ``steps`` forward/backward
    passes on fixed data; returns the run's series and Dynamo's counts."""
    dynamo.reset()
    before = dynamo_counts()
    w = tl.watch(
        target,
        run_dir=run_dir,
        backend=None,
        verbose=False,
        sample_n=None,
        reject_outlier_proportion=0,
        log_freq=2,
        input_grads=True,
    )
    if compile_in_place is not None:
        compile_in_place()
    torch.manual_seed(1)
    for _ in range(steps):  # no optimizer: the parameters stay those of the eager run
        target(torch.randn(16, 4)).sum().backward()
    w.close()
    after = dynamo_counts()
    run = tl.open_run(w.run_dir)
    series = {}
    for key in run.series_names():
        s = run.series(*key)
        series[key] = (s.counts.tolist(), np.asarray(s.min).tolist(), np.asarray(s.max).tolist())
    return series, {k: after[k] - before[k] for k in after}, list(run.steps)


@pytest.fixture
def eager(tmp_path):
    return _train(_model(), str(tmp_path / "eager"))


def _compiled(how: str, fullgraph: bool = False) -> tuple:
    """(the module to call and watch, what to call after watching) for each way to compile."""
    m = _model()
    if how == "wrapper":
        return torch.compile(m, backend=BACKEND, fullgraph=fullgraph), None
    if how == "submodule":
        m[2] = torch.compile(m[2], backend=BACKEND, fullgraph=fullgraph)
        return m, None
    return m, lambda: m.compile(backend=BACKEND, fullgraph=fullgraph)  # in place, after watching


@pytest.mark.parametrize("how", ["wrapper", "submodule", "in_place"])
def test_compiled_model_gives_the_eager_series(eager, tmp_path, how):
    target, after_watch = _compiled(how)
    series, counts, steps = _train(target, str(tmp_path / how), compile_in_place=after_watch)
    assert steps == eager[2] == [0, 2, 4]
    assert sorted(series) == sorted(eager[0])  # eager call ids: no '_orig_mod' in them
    assert series == eager[0]  # logged steps ran eagerly: the same values, bin for bin
    assert counts["graphs"] == 1  # compiled once, for the unlogged steps
    # hooks never reach Dynamo; the watched model compiled in place calls its two root hooks
    # across graph breaks, which Dynamo counts once per frame it compiles, not per step
    assert counts["graph_breaks"] == (0 if how != "in_place" else counts["graph_breaks"])
    assert torch._dynamo.eval_frame._stance.stance == "default"  # the switch is put back
    assert "compile" not in vars(target)  # the watch's model.compile() interception is gone


@pytest.mark.parametrize("input_grads", [False, True])
def test_watched_model_compiles_no_more_than_unwatched(tmp_path, input_grads):
    def frames(watched: bool, steps: int, how: str) -> int:
        dynamo.reset()
        target, after_watch = _compiled(how)
        before = dynamo_counts()["frames"]
        folder = str(tmp_path / f"{how}{watched}{steps}")
        w = tl.watch(target, run_dir=folder, backend=None, verbose=False, log_freq=3, input_grads=input_grads)
        if not watched:
            w.close()
        if after_watch is not None:
            after_watch()
        for _ in range(steps):
            target(torch.randn(16, 4)).sum().backward()
        w.close()
        return dynamo_counts()["frames"] - before

    # the first (traced, logged) pass and the logged steps run eagerly: nothing recompiles
    assert frames(True, 7, "wrapper") == frames(False, 7, "wrapper") == 1
    assert frames(True, 7, "submodule") == frames(False, 7, "submodule") == 1
    # in place: the frames around the two graph breaks are compiled once, not once per step
    assert frames(True, 4, "in_place") == frames(True, 10, "in_place")


def test_fullgraph_records_parameters_and_warns_once(eager, tmp_path):
    target, _ = _compiled("wrapper", fullgraph=True)
    with pytest.warns(RuntimeWarning, match="fullgraph=True") as caught:
        series, counts, _ = _train(target, str(tmp_path / "full"))
    assert len([w for w in caught if "fullgraph" in str(w.message)]) == 1
    assert "io and io_grad are not recorded" in str(caught[0].message)
    params = {k for k in eager[0] if k[1] in ("params", "params_grad")}
    assert params and params <= set(series)
    assert all(series[k] == eager[0][k] for k in params)
    # the model's own call is outside the graph (the wrapper's hooks): its io is recorded
    assert {k for k in series if k[1] in ("io", "io_grad")} == {k for k in eager[0] if k[0] == "" and "io" in k[1]}
    assert counts["graph_breaks"] == 0 and counts["graphs"] == 1


def test_fullgraph_submodule_keeps_the_rest(eager, tmp_path):
    target, _ = _compiled("submodule", fullgraph=True)
    with pytest.warns(RuntimeWarning, match="'2', '2.0', '2.1'"):
        series, counts, _ = _train(target, str(tmp_path / "sub"))
    missing = set(eager[0]) - set(series)
    assert missing and all(k[0].startswith("2") and k[1] in ("io", "io_grad") for k in missing)
    assert all(series[k] == eager[0][k] for k in series)
    assert counts["graph_breaks"] == 0


def test_in_place_fullgraph_warns_and_training_goes_on(tmp_path):
    target, after_watch = _compiled("in_place", fullgraph=True)
    with pytest.warns(RuntimeWarning, match="nothing is recorded"):
        series, _, steps = _train(target, str(tmp_path / "ip"), compile_in_place=after_watch)
    assert series == {} and steps == []


def test_eager_watch_imports_no_dynamo(tmp_path):
    """Watching an eager model must not load Dynamo (seconds of import) to look for compiled parts."""
    import subprocess
    import sys

    code = (
        "import sys, torch, tempfile, torchlens as tl\n"
        "m = torch.nn.Linear(2, 2)\n"
        "w = tl.watch(m, run_dir=tempfile.mkdtemp(), backend=None, verbose=False)\n"
        "m(torch.ones(3, 2)).sum().backward(); w.close()\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_no_warning_without_compile(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train(_model(), str(tmp_path / "plain"), steps=2)
