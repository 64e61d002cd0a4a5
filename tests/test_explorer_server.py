"""The explorer's server and exported file without a browser: routes, security, bad input."""

from __future__ import annotations

import http.client
import json
import socket

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.cli import main as cli_main
from torchlens.train.serve import explore, export_html


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs") / "first"
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Sequential(nn.Flatten(), nn.Linear(4 * 6 * 6, 2)))
    with tl.watch(model, run_dir=str(folder), backend=None, verbose=False):
        for _ in range(3):
            model(torch.randn(2, 3, 8, 8)).sum().backward()
    return str(folder)


@pytest.fixture(scope="module")
def server(run_dir):
    s = explore(run_dir, port=0, block=False)
    yield s
    s.close()


def get(server, path):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", path)  # sent as is: no client-side normalisation of '..'
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def get_json(server, path):
    status, body = get(server, path)
    return status, json.loads(body)


def test_page_assets_and_run_routes(server):
    status, body = get(server, "/")
    assert status == 200 and b'data-role="panels"' in body
    assert get(server, "/assets/explorer.js")[0] == 200
    status, runs = get_json(server, "/api/runs")
    assert status == 200 and [r["id"] for r in runs["runs"]] == ["."]
    status, summary = get_json(server, "/api/run")
    assert summary["steps"] == [0, 1, 2] and summary["calls"]["2:1"]["children"] == ["2.0:1", "2.1:1"]
    status, layout = get_json(server, "/api/layout?call=2:1")
    assert {n["id"] for n in layout["nodes"]} == {"input 0", "2.0:1", "2.1:1", "output 0"}
    assert {(e["from"], e["to"]) for e in layout["edges"]} == {
        ("input 0", "2.0:1"),
        ("2.0:1", "2.1:1"),
        ("2.1:1", "output 0"),
    }
    assert all(n["w"] > 0 and "x" in n for n in layout["nodes"])
    status, panel = get_json(server, "/api/call_series?call=0:1")
    assert {(s["kind"], s["name"]) for s in panel["series"]} >= {("io", "output 0"), ("params_grad", "weight")}
    status, newer = get_json(server, "/api/call_series?call=0:1&since=2")
    assert all(s["steps"] == [2] for s in newer["series"])
    status, poll = get_json(server, "/api/poll?since=1")
    assert poll["steps"] == [2] and poll["status"] == "finished"
    assert poll["num_calls"] == len(summary["calls"])
    status, everything = get_json(server, "/api/poll?since=-1")
    assert everything["steps"] == [0, 1, 2]


@pytest.mark.parametrize(
    "path",
    [
        "/assets/../server.py",
        "/assets/%2e%2e/server.py",
        "/assets/..%2fdata.py",
        "/assets//etc/passwd",
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/assets/data.py",
        "/etc/passwd",
        "/api/run?run=../../etc",
        "/api/run?run=/etc",
        "/api/layout?call=2:1&run=..",
        "/api/nothing",
        "/assets/",
        "/api/layout?call=nope:1",
    ],
)
def test_anything_else_is_404_and_the_server_keeps_serving(server, path):
    status, body = get(server, path)
    assert status == 404, (path, body[:200])
    assert b"root:" not in body and b"import" not in body
    assert get(server, "/api/runs")[0] == 200


@pytest.mark.parametrize(
    "path",
    [
        "/api/layout",
        "/api/call_series?call=0:1&since=abc",
        "/api/poll?since=1.5",
        "/api/series?call=0:1&kind=io",
        "/api/series?call=0:1&kind=bogus&name=x",
        "/api/series?call=0:1&kind=io&name=nothing",
    ],
)
def test_malformed_queries_are_400(server, path):
    status, answer = get_json(server, path)
    assert status == 400 and answer["error"]
    assert get(server, "/api/runs")[0] == 200


def test_a_corrupted_run_is_reported_not_crashed(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.db").write_bytes(b"garbage" * 500)
    s = explore(str(bad), port=0, block=False)
    try:
        status, answer = get_json(s, "/api/run")
        assert status == 500 and "corrupted" in answer["error"] and "Traceback" not in answer["error"]
        assert get(s, "/")[0] == 200
    finally:
        s.close()


def test_folder_of_runs(tmp_path, run_dir):
    for name in ("a", "b/c"):
        model = nn.Linear(2, 2)
        with tl.watch(model, run_dir=str(tmp_path / name), backend=None, verbose=False):
            model(torch.ones(1, 2)).sum().backward()
    (tmp_path / "not-a-run").mkdir()
    s = explore(str(tmp_path), port=0, block=False)
    try:
        status, runs = get_json(s, "/api/runs")
        assert [r["id"] for r in runs["runs"]] == ["a", "b/c"]
        assert get_json(s, "/api/run?run=b/c")[1]["model"] == "Linear"
        assert get(s, "/api/run")[0] == 404  # several runs: the page must say which
    finally:
        s.close()


def test_export_is_self_contained(tmp_path, run_dir):
    page = export_html(run_dir, str(tmp_path / "page.html"))
    text = open(page, encoding="utf-8").read()
    assert "window.TORCHLENS_EXPORT" in text and "<style>" in text
    assert (
        'src="/assets' not in text
        and 'href="/assets' not in text
        and "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    )
    data = json.loads(text.split("window.TORCHLENS_EXPORT = ", 1)[1].split(";</script>", 1)[0].replace("<\\/", "</"))
    assert set(data["layouts"]) == {"", "2:1"}
    assert data["call_series"]["0:1"]["series"]


def test_command_line(tmp_path, run_dir, capsys):
    assert cli_main(["explore", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    out = tmp_path / "p.html"
    assert cli_main(["explore", run_dir, "--export", str(out)]) == 0 and out.stat().st_size > 1000
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    try:
        assert cli_main(["explore", run_dir, "--port", str(port)]) == 2
        assert f"port {port}" in capsys.readouterr().err
    finally:
        sock.close()
