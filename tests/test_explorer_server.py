"""The explorer's server and exported file without a browser: routes, security, bad input."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

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
    with_values = [s for s in newer["series"] if s["reason"] is None]
    assert with_values and all(s["steps"] == [2] for s in with_values)
    # the data's gradient is off by default: that series says why it has no values
    assert [(s["kind"], s["name"], s["steps"]) for s in newer["series"] if s["reason"]] == [("io_grad", "input 0", [])]
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


# ----- who may ask: Host, Origin, token -----------------------------------------------------------
def request(port, path, method="GET", host="127.0.0.1", headers=None):
    """``headers`` sent as given (a ``Host`` among them replaces the real one)."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(method, path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


@pytest.mark.parametrize("name", ["evil.example.com", "evil.example.com:{port}", "localhost.evil.com", "", "a:b:c"])
def test_a_foreign_host_is_refused(server, run_dir, name):
    response, body = request(server.port, "/api/runs", headers={"Host": name.format(port=server.port)})
    assert response.status == 403 and b"Host" in body
    assert run_dir.encode() not in body and b'"runs"' not in body
    assert request(server.port, "/", headers={"Host": name.format(port=server.port)})[0].status == 403


@pytest.mark.parametrize(
    "name", ["localhost:{port}", "LOCALHOST:{port}", "127.0.0.1:{port}", "[::1]:{port}", "localhost"]
)
def test_the_served_host_is_answered(server, name):
    response, body = request(server.port, "/api/runs", headers={"Host": name.format(port=server.port)})
    assert response.status == 200 and json.loads(body)["runs"][0]["id"] == "."


def test_json_carries_no_absolute_path(server, run_dir, tmp_path):
    for path in ("/api/runs", "/api/run", "/api/run?run=nope", "/api/poll", "/api/layout?call=2:1"):
        assert run_dir.encode() not in get(server, path)[1], path
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.db").write_bytes(b"garbage" * 500)
    s = explore(str(tmp_path), port=0, block=False)
    try:
        for path in ("/api/runs", "/api/run?run=bad"):
            status, body = get(s, path)
            assert b"corrupted" in body and str(tmp_path).encode() not in body, (path, body)
    finally:
        s.close()


def test_anything_but_a_read_needs_the_served_origin(server):
    here = f"http://localhost:{server.port}"
    headers = {"Host": f"localhost:{server.port}", "Content-Type": "application/json"}
    for method in ("POST", "PUT", "DELETE"):
        assert request(server.port, "/api/run", method, headers=headers)[0].status == 403
        foreign = request(server.port, "/api/run", method, headers={**headers, "Origin": "http://evil.example.com"})
        assert foreign[0].status == 403 and b"cross-origin" in foreign[1]
        assert request(server.port, "/api/run", method, headers={**headers, "Origin": here})[0].status == 405
    # a read with a foreign Origin (a page elsewhere) is refused too; the page's own is answered
    assert request(server.port, "/api/run", headers={**headers, "Origin": "http://evil.example.com"})[0].status == 403
    assert request(server.port, "/api/run", headers={**headers, "Origin": here})[0].status == 200


def test_loopback_needs_no_token(server):
    assert server.url == f"http://localhost:{server.port}" and get(server, "/api/runs")[0] == 200


def test_another_address_needs_the_printed_token(run_dir):
    s = explore(run_dir, host="127.0.0.2", port=0, block=False)
    try:
        assert s.url.startswith(f"http://127.0.0.2:{s.port}/?token=")
        token = s.url.split("?token=", 1)[1]
        at = {"host": "127.0.0.2"}
        for path in ("/", "/api/runs", "/assets/explorer.js", "/api/run?token=wrong", f"/api/run?token={token}x"):
            response, body = request(s.port, path, **at)
            assert response.status == 403 and b"token" in body and b'"runs"' not in body, path
        assert request(s.port, f"/api/runs?token={token}", **at)[0].status == 200
        assert request(s.port, "/api/runs", headers={"Authorization": f"token {token}"}, **at)[0].status == 200
        # first load: the token moves into a cookie and out of the address bar
        response, _ = request(s.port, f"/?token={token}", **at)
        assert response.status == 302 and response.getheader("Location") == "/"
        cookie = response.getheader("Set-Cookie")
        assert token in cookie and "HttpOnly" in cookie
        jar = {"Cookie": cookie.split(";", 1)[0]}
        assert request(s.port, "/", headers=jar, **at)[0].status == 200
        assert request(s.port, "/api/poll", headers=jar, **at)[0].status == 200
        # the token does not open the server to a foreign Host
        foreign = {**jar, "Host": f"evil.example.com:{s.port}"}
        assert request(s.port, f"/api/runs?token={token}", headers=foreign, **at)[0].status == 403
        assert request(s.port, "/api/runs", headers={**jar, "Host": f"127.0.0.2:{s.port}"}, **at)[0].status == 200
    finally:
        s.close()
    fixed = explore(run_dir, host="127.0.0.2", port=0, block=False, token="chosen")
    try:
        assert fixed.url.endswith("/?token=chosen")
        assert request(fixed.port, "/api/runs?token=chosen", host="127.0.0.2")[0].status == 200
    finally:
        fixed.close()


# ----- tl.watch serves from a process of its own ------------------------------------------------------
def _gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper that is not ours counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_watch_serves_from_its_own_process_until_closed(tmp_path):
    def serving_threads():
        return sum(t.name == "torchlens-explorer" for t in threading.enumerate())

    before = serving_threads()
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    w = tl.watch(model, run_dir=str(tmp_path / "run"), port=0, verbose=False)
    try:
        started = time.monotonic()
        runs = json.load(urllib.request.urlopen(w.url + "/api/runs", timeout=10))
        assert runs["runs"][0]["status"] == "running" and time.monotonic() - started < 2  # live at once
        assert w._server.wait_ready(timeout=60), "the serving process did not start"
        pid = w._server.process.pid
        assert pid != os.getpid() and serving_threads() == before  # the training process serves nothing
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
        w.flush()
        poll = json.load(urllib.request.urlopen(w.url + "/api/poll?since=0", timeout=10))
        assert poll["steps"] == [1, 2] and poll["status"] == "running"  # read from the database
    finally:
        w.close()
    assert _gone(pid) and _refused(int(w.url.rsplit(":", 1)[1]))


TRAINING_SCRIPT = """
import os, sys, time, torch, torchlens as tl
model = torch.nn.Linear(2, 2)
w = tl.watch(model, run_dir=sys.argv[1], port=0, verbose=False)
model(torch.ones(1, 2)).sum().backward()
w.flush()
assert w._server.wait_ready(timeout=120)
print(w._server.process.pid, w._server.port, flush=True)
if sys.argv[2] == "hang":
    time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("end", ["exit", "killed"])
def test_the_serving_process_ends_with_the_training_process(tmp_path, end):
    script = tmp_path / "train.py"
    script.write_text(TRAINING_SCRIPT)
    mode = "exit" if end == "exit" else "hang"  # exit: no w.close(), atexit stops it
    training = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "run"), mode], stdout=subprocess.PIPE, text=True
    )
    try:
        pid, port = map(int, training.stdout.readline().split())
        if end == "killed":
            assert json.load(urllib.request.urlopen(f"http://localhost:{port}/api/poll", timeout=10))["steps"] == [0]
            training.kill()
        training.wait(timeout=120)
        deadline = time.monotonic() + 10
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid) and _refused(port)
    finally:
        training.kill()
        training.wait()


def test_command_line_off_loopback_prints_the_url_with_its_token(run_dir):
    command = "import sys; from torchlens.cli import main; sys.exit(main(sys.argv[1:]))"
    serving = subprocess.Popen(
        [sys.executable, "-c", command, "explore", run_dir, "--host", "127.0.0.2", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = serving.stdout.readline()
        url = line.split(" at ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.2:") and "/?token=" in url, line
        port, token = int(url.split(":")[2].split("/")[0]), url.split("?token=", 1)[1]
        assert request(port, "/api/runs", host="127.0.0.2")[0].status == 403
        assert request(port, f"/api/runs?token={token}", host="127.0.0.2")[0].status == 200
    finally:
        serving.terminate()
        serving.wait(timeout=30)


def test_the_page_works_with_its_token_and_not_without(browser, run_dir):
    s = explore(run_dir, host="127.0.0.2", port=0, block=False)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(s.url + "#view=2:1")
        page.wait_for_selector('[data-node="2.0:1"]', timeout=20_000)  # the page and its JSON routes answered
        assert "token" not in page.url and page.url.startswith(f"http://127.0.0.2:{s.port}/")
        page.reload()  # the cookie carries the token from now on; the view survives the redirect
        page.wait_for_selector('[data-node="2.1:1"]', timeout=20_000)
        other = browser.new_context().new_page()  # no cookie, no token
        try:
            response = other.goto(f"http://127.0.0.2:{s.port}/")
            assert response.status == 403 and "token" in other.content()
        finally:
            other.context.close()
    finally:
        context.close()
        s.close()


def test_watch_off_loopback_prints_a_token_its_process_wants(tmp_path, capsys):
    model = nn.Linear(2, 2)
    w = tl.watch(model, run_dir=str(tmp_path / "run"), port=0, host="127.0.0.2")
    try:
        assert "?token=" in w.url and w.url in capsys.readouterr().out
        port, token = int(w.url.split(":")[2].split("/")[0]), w.url.split("?token=", 1)[1]
        assert w._server.wait_ready(timeout=60)
        assert request(port, "/api/runs", host="127.0.0.2")[0].status == 403
        assert request(port, f"/api/runs?token={token}", host="127.0.0.2")[0].status == 200
        assert (
            request(port, f"/api/runs?token={token}", host="127.0.0.2", headers={"Host": "evil.example.com"})[0].status
            == 403
        )
    finally:
        w.close()


def test_a_token_that_cannot_travel_in_a_url_is_refused(run_dir, capsys):
    with pytest.raises(ValueError, match="only letters, digits"):
        explore(run_dir, host="127.0.0.2", port=0, block=False, token="a b;c")
    assert cli_main(["explore", run_dir, "--host", "127.0.0.2", "--port", "0", "--token", "a;b"]) == 2
    assert "only letters, digits" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_serving_process_that_dies_is_reaped_at_once(tmp_path):
    model = nn.Linear(2, 2)
    w = tl.watch(model, run_dir=str(tmp_path / "run"), port=0, verbose=False)
    try:
        assert w._server.wait_ready(timeout=60)
        pid = w._server.process.pid
        os.kill(pid, signal.SIGKILL)  # e.g. the OOM killer
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}"), "left a zombie"
        assert not w._server.ready
    finally:
        w.close()
