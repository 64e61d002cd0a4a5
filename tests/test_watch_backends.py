"""Backends of tl.watch with the real libraries: TensorBoard event files, a wandb offline run,
and a Lightning fit on the CPU. No mocks: what each library wrote is read back."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

import torchlens as tl


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def three_steps(model):
    for _ in range(3):
        model(torch.randn(6, 3)).pow(2).mean().backward()


def test_importing_torchlens_imports_no_backend():
    code = (
        "import sys, torchlens; bad = [m for m in ('wandb', 'tensorboard', 'lightning', 'pytorch_lightning') "
        "if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ----- TensorBoard ------------------------------------------------------------------------------
def test_tensorboard_histograms_match_the_run(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = tiny()
    w = tl.watch(model, backend="tensorboard", run_dir=str(tmp_path / "run"), verbose=False)
    three_steps(model)
    w.close()
    events = EventAccumulator(w.run_dir, size_guidance={"histograms": 0})
    events.Reload()
    tags = events.Tags()["histograms"]
    assert "torchlens/0:1/params_grad/weight" in tags and "torchlens/model/io/input 0" in tags
    run = tl.open_run(w.run_dir)
    with_values = [key for key in run.series_names() if len(run.series(*key).steps)]
    assert len(tags) == len(with_values) < len(run.series_names())  # the data's gradients: none
    for tag in ("torchlens/0:1/io/output 0", "torchlens/2:1/params_grad/weight", "torchlens/1:1/io_grad/input 0"):
        _, call, kind, name = tag.split("/", 3)
        series = run.series(call, kind, name)
        logged = events.Histograms(tag)
        assert [e.step for e in logged] == series.steps.tolist()
        for i, event in enumerate(logged):
            h = event.histogram_value
            assert list(h.bucket) == pytest.approx(series.counts[i].tolist())
            assert h.min == pytest.approx(series.min[i]) and h.max == pytest.approx(series.max[i])
            assert h.num == pytest.approx(series.counts[i].sum())
            assert list(h.bucket_limit) == pytest.approx(series.bin_edges[i][1:].tolist())


def test_tensorboard_gets_the_module_graph(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Twice(nn.Module):  # a block with children, and a module called twice
        def __init__(self) -> None:
            super().__init__()
            self.block = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
            self.act = nn.Tanh()

        def forward(self, x):
            return self.act(self.block(self.act(x)))

    model = Twice()
    w = tl.watch(model, backend="tensorboard", run_dir=str(tmp_path / "run"), verbose=False)
    for _ in range(2):
        model(torch.rand(2, 3)).sum().backward()
    w.close()
    events = EventAccumulator(w.run_dir)
    events.Reload()
    graph = events.Graph()
    inputs = {n.name: list(n.input) for n in graph.node}
    assert inputs == {
        "Twice/input 0": [],
        "Twice/act (call 1)": ["Twice/input 0"],
        "Twice/block/input 0": ["Twice/act (call 1)"],
        "Twice/block/0": ["Twice/block/input 0"],
        "Twice/block/1": ["Twice/block/0"],
        "Twice/block/output 0": ["Twice/block/1"],
        "Twice/act (call 2)": ["Twice/block/output 0"],
        "Twice/output 0": ["Twice/act (call 2)"],
    }
    ops = {n.name: n.op for n in graph.node}
    assert ops["Twice/block/0"] == "Linear" and ops["Twice/act (call 2)"] == "Tanh"
    linear = next(n for n in graph.node if n.name == "Twice/block/0")
    assert [d.size for d in linear.attr["_output_shapes"].list.shape[0].dim] == [2, 4]
    assert linear.attr["extra_repr"].s.decode() == "in_features=3, out_features=4, bias=True"
    assert all(":" not in name for name in inputs)  # ':' would read as an output port


def test_tensorboard_into_the_users_writer(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    model = tiny()
    with tl.watch(
        model,
        backend=("tensorboard",),
        tensorboard_writer=writer,
        run_dir=str(tmp_path / "run"),
        verbose=False,
        log=("params",),
    ):
        three_steps(model)
    writer.add_scalar("loss", 1.0, 0)  # still the user's, still open
    writer.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0})
    events.Reload()
    assert sorted(events.Tags()["histograms"]) == [
        "torchlens/0:1/params/bias",
        "torchlens/0:1/params/weight",
        "torchlens/2:1/params/bias",
        "torchlens/2:1/params/weight",
    ]
    assert events.Tags()["scalars"] == ["loss"]


# ----- Weights & Biases (offline: nothing leaves the machine) -----------------------------------
def _wandb_records(path):
    """The records of an offline run's .wandb file (a LevelDB-style log of protobuf records).
    wandb-core writes the file in the background, after wandb.finish() returns: wait for its
    final 'exit' record."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + 30
    while True:
        try:
            records = list(_read_wandb_file(path))
        except DecodeError:  # a record read while it was being written: read the file again
            if time.monotonic() > deadline:
                raise
            records = []
        if (records and records[-1].WhichOneof("record_type") == "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _read_wandb_file(path):
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        raw = f.read()
    assert raw[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0 or pos + 7 + length > len(raw):  # not written yet, or not all of it
            return
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # full, first
            pending = data
        elif kind in (3, 4):  # middle, last
            pending += data
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    yield wandb
    if wandb.run is not None:
        wandb.finish()


def test_wandb_histograms_and_page(tmp_path, offline_wandb):
    wandb = offline_wandb
    run = wandb.init(project="torchlens-test", dir=str(tmp_path))
    model = tiny()
    w = tl.watch(
        model, backend=("standalone", "wandb"), port=0, run_dir=str(tmp_path / "run"), verbose=False, wandb_html_every=2
    )
    three_steps(model)
    w.close()
    offline_dir = os.path.dirname(run.dir)
    wandb.finish()
    rows = []
    for record in _wandb_records(glob.glob(os.path.join(offline_dir, "run-*.wandb"))[0]):
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
    histogram_rows = [r for r in rows if "torchlens/2:1/params_grad/weight/_type" in r]
    assert [r["torchlens/step"] for r in histogram_rows] == [0, 1, 2]
    ours = tl.open_run(w.run_dir).series("2:1", "params_grad", "weight")
    for i, row in enumerate(histogram_rows):
        assert row["torchlens/2:1/params_grad/weight/_type"] == "histogram"
        assert row["torchlens/2:1/params_grad/weight/values"] == [int(c) for c in ours.counts[i]]
        assert row["torchlens/2:1/params_grad/weight/bins"] == pytest.approx(ours.bin_edges[i].tolist())
    pages = glob.glob(os.path.join(offline_dir, "files", "media", "html", "torchlens", "explorer_*.html"))
    assert len(pages) == 3  # first logged step, every 2nd, and the final state at close
    newest = max(pages, key=os.path.getmtime)
    with open(newest, encoding="utf-8") as f:
        text = f.read()
    assert "window.TORCHLENS_EXPORT" in text and '"steps":[0,1,2]' in text


def test_wandb_without_a_run_is_refused_before_anything(tmp_path, offline_wandb):
    model = tiny()
    with pytest.raises(RuntimeError, match=r"wandb.init\(\)"):
        tl.watch(model, backend="wandb", run_dir=str(tmp_path / "run"), verbose=False)
    assert not (tmp_path / "run").exists() and not model._forward_pre_hooks


def test_missing_backend_package_gives_an_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'torchlens\[wandb\]'"):
        tl.watch(tiny(), backend="wandb", run_dir=str(tmp_path / "run"), verbose=False)


# ----- Lightning -----------------------------------------------------------------------------------
def test_lightning_fit(tmp_path):
    L = pytest.importorskip("lightning")
    from torchlens.train.callbacks.lightning import TorchlensCallback

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val", nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    callback = TorchlensCallback(run_dir=str(tmp_path / "run"), backend=None, verbose=False, log_freq=1)
    trainer = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=2,
        default_root_dir=str(tmp_path),
    )
    module = Regressor()
    trainer.fit(module, loader, loader)
    assert callback.watch.closed and not module._forward_pre_hooks
    run = tl.open_run(str(tmp_path / "run"))
    # 4 batches per epoch, 2 per optimizer step: 2 optimizer steps per epoch, 6 in all
    assert run.steps.tolist() == [0, 1, 2, 3, 4, 5] and trainer.global_step == 6
    s = run.series("net.0:1", "io", "input 0")
    assert s.counts.sum(axis=1).tolist() == [44] * 6  # two batches of 8x3 values overlaid, 10% rejected
    assert ("input 0", "net:1") in run.calls[""].edges
    assert run.series("net.2:1", "params_grad", "weight").steps.tolist() == [0, 1, 2, 3, 4, 5]


def test_wandb_leaves_the_users_steps_alone(tmp_path, offline_wandb):
    """The user's own wandb.log calls keep _step 0..N-1: torchlens' histograms join the user's
    next row (commit=False) instead of committing rows of their own."""
    wandb = offline_wandb
    run = wandb.init(project="torchlens-test", dir=str(tmp_path))
    model = tiny()
    w = tl.watch(model, backend="wandb", run_dir=str(tmp_path / "run"), verbose=False, wandb_html_every=5)
    for _ in range(20):
        loss = model(torch.randn(6, 3)).pow(2).mean()
        loss.backward()
        wandb.log({"loss": loss.item()})
    w.close()
    offline_dir = os.path.dirname(run.dir)
    wandb.finish()
    rows = []
    for record in _wandb_records(glob.glob(os.path.join(offline_dir, "run-*.wandb"))[0]):
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
    assert [r["_step"] for r in rows if "loss" in r] == list(range(20))
    logged = [r["torchlens/step"] for r in rows if "torchlens/step" in r]
    assert logged == sorted(logged) and len(logged) == len(tl.open_run(w.run_dir).steps)
