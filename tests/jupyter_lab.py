"""A real JupyterLab on loopback for the notebook tests: started in a temporary root with a
token, its settings and runtime files kept there too, and always stopped (its kernels first)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Iterator, NamedTuple


class Lab(NamedTuple):
    url: str  # http://127.0.0.1:PORT
    token: str
    root: str

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(f"{self.url}{path}", method=method)
        request.add_header("Authorization", f"token {self.token}")
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read()
        return json.loads(body) if body else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyter_lab(root: str, start_timeout: float = 90.0) -> Iterator[Lab]:
    """JupyterLab serving ``root`` on 127.0.0.1 (``window.jupyterapp`` exposed for the tests)."""
    port, token = _free_port(), secrets.token_hex(16)
    private = os.path.join(root, ".lab")
    env = dict(os.environ)
    for name, sub in (
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTERLAB_SETTINGS_DIR", "settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
    ):
        env[name] = os.path.join(private, sub)
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",  # never asks PyPI for extensions
    ] + (["--allow-root"] if os.geteuid() == 0 else [])  # CI runs as root
    os.makedirs(private, exist_ok=True)
    log = open(os.path.join(private, "server.log"), "wb")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                lab.api("/api/status")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start: {open(log.name).read()[-2000:]}") from None
                time.sleep(0.3)
        yield lab
    finally:
        with contextlib.suppress(Exception):
            for kernel in lab.api("/api/kernels"):  # type: ignore[union-attr]
                lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()
