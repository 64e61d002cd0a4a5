"""``torchlens explore``: a run, a folder of runs, exported to one file or served."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.cli import main


def exported(path) -> dict:
    text = open(path, encoding="utf-8").read()
    return json.loads(text.split("window.TORCHLENS_EXPORT = ", 1)[1].split(";</script>", 1)[0].replace("<\\/", "</"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A folder of two runs of different models (one nested a level deeper)."""
    root = tmp_path_factory.mktemp("runs")
    for name, model in (("a", nn.Linear(2, 2)), ("b/c", nn.Sequential(nn.Linear(2, 3), nn.Tanh()))):
        with tl.watch(model, run_dir=str(root / name), backend=None, verbose=False):
            for _ in range(2):
                model(torch.ones(1, 2)).sum().backward()
    return root


def test_export_of_a_folder_holds_every_run(runs, tmp_path, capsys):
    out = tmp_path / "all.html"
    assert main(["explore", str(runs), "--export", str(out)]) == 0
    assert "2 runs" in capsys.readouterr().out
    data = exported(out)
    assert [r["id"] for r in data["runs"]] == ["a", "b/c"]
    assert data["run_data"]["a"]["summary"]["model"] == "Linear"
    assert data["run_data"]["b/c"]["summary"]["model"] == "Sequential"
    assert data["run_data"]["b/c"]["call_series"]["0:1"]["series"]
    assert str(runs) not in out.read_text()  # ids are relative: no absolute path in the file


@pytest.mark.parametrize("name", ["b/c", "c"])
def test_export_of_one_run_of_a_folder(runs, tmp_path, name):
    out = tmp_path / "one.html"
    assert main(["explore", str(runs), "--export", str(out), "--run", name]) == 0
    data = exported(out)
    assert "runs" not in data and data["summary"]["model"] == "Sequential"


def test_an_unknown_run_names_the_runs_there(runs, tmp_path, capsys):
    assert main(["explore", str(runs), "--export", str(tmp_path / "x.html"), "--run", "zzz"]) == 2
    err = capsys.readouterr().err
    assert "no run 'zzz'" in err and "a, b/c" in err and "Traceback" not in err


def test_a_folder_without_runs_says_so(tmp_path, capsys):
    assert main(["explore", str(tmp_path), "--export", str(tmp_path / "x.html")]) == 2
    assert "no torchlens run" in capsys.readouterr().err


def test_help_says_what_export_of_a_folder_writes(capsys):
    with pytest.raises(SystemExit):
        main(["explore", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "every run" in out and "--run NAME" in out


def test_a_busy_port_is_named_as_the_option(runs, capsys):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        assert main(["explore", str(runs / "a"), "--port", str(port)]) == 2
    finally:
        sock.close()
    err = capsys.readouterr().err
    assert f"port {port}" in err and f"--port {port + 1}" in err and "port=" not in err


def test_an_unreadable_run_is_listed_as_such_in_the_export(runs, tmp_path, capsys):
    folder = tmp_path / "mixed"
    model = nn.Linear(2, 2)
    with tl.watch(model, run_dir=str(folder / "good"), backend=None, verbose=False):
        model(torch.ones(1, 2)).sum().backward()
    (folder / "bad").mkdir()
    (folder / "bad" / "run.db").write_bytes(b"garbage" * 600)
    out = tmp_path / "mixed.html"
    assert main(["explore", str(folder), "--export", str(out)]) == 0
    data = exported(out)
    listed = {r["id"]: r for r in data["runs"]}
    assert set(listed) == {"bad", "good"} and "corrupted" in listed["bad"]["error"]
    assert set(data["run_data"]) == {"good"}
    assert str(folder) not in out.read_text()


def test_run_goes_with_export(runs, capsys):
    assert main(["explore", str(runs), "--run", "a"]) == 2
    assert "--run NAME goes with --export" in capsys.readouterr().err
