"""A small HTTP server for a run, in a background thread of the training process (or of
``torchlens explore``). It only reads the run through ``Run``, so a live run and a finished one
look the same; answers are JSON, and ``since=`` keeps live updates to what is new."""
from __future__ import annotations

import errno
import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlparse

from .reader import Run, RunError


class PortInUseError(OSError):
    """The port asked for is taken by another program."""


def _clean(x: float) -> Optional[float]:
    return None if x is None or not math.isfinite(x) else float(x)


def run_summary(run: Run) -> dict:
    return {"model": run.model_name, "status": run.status, "steps": run.steps.tolist(), "stride": run.stride,
            "bins": run.bins, "calls": {cid: c.to_dict() for cid, c in run.calls.items()},
            "series": run.series_names()}


def series_json(run: Run, call: str, kind: str, name: str, since: Optional[int]) -> dict:
    s = run.series(call, kind, name, since=since)
    return {"call": call, "kind": kind, "name": name, "steps": s.steps.tolist(), "last_steps": s.last_steps.tolist(),
            "lo": [_clean(v) for v in s.min], "hi": [_clean(v) for v in s.max],
            "counts": s.counts.round(3).tolist(), "nonfinite": s.nonfinite.tolist()}


class _Handler(BaseHTTPRequestHandler):
    run: Run  # set on the subclass made for each server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: training output stays readable
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any, status: int = 200) -> None:
        self._send(status, json.dumps(value).encode(), "application/json")

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            if url.path == "/api/run":
                self._json(run_summary(self.run))
            elif url.path == "/api/series":
                since = int(query["since"]) if "since" in query else None
                self._json(series_json(self.run, query["call"], query["kind"], query["name"], since))
            elif url.path == "/":
                self._send(200, _INDEX.encode(), "text/html; charset=utf-8")
            else:
                self._json({"error": f"no such path: {url.path}"}, 404)
        except (KeyError, ValueError) as error:
            self._json({"error": str(error)}, 400)
        except RunError as error:
            self._json({"error": str(error)}, 500)


_INDEX = """<!doctype html><meta charset="utf-8"><title>torchlens run</title>
<p>torchlens run server. The run's data: <a href="/api/run">/api/run</a>;
one series: <code>/api/series?call=ID&amp;kind=io&amp;name=output%200&amp;since=STEP</code>.</p>"""


class RunServer:
    """Serves one run on ``host:port`` from a daemon thread until ``close()``."""

    def __init__(self, run_dir: str, host: str = "127.0.0.1", port: int = 8080) -> None:
        try:
            handler = type("Handler", (_Handler,), {})
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUseError(
                    error.errno, f"torchlens: port {port} on {host} is in use (or not allowed). Pass another "
                    f"port, e.g. port={port + 1} (or port=0 for any free port).") from None
            raise
        self.httpd.daemon_threads = True
        self.run_dir = run_dir
        self._handler = handler
        self._handler.run = None  # opened once the run database exists
        self.host, self.port = host, self.httpd.server_address[1]
        self.thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host = "localhost" if self.host in ("127.0.0.1", "localhost") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        self._handler.run = Run(self.run_dir)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="torchlens-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.thread is not None:
            self.httpd.shutdown()
            self.thread.join(timeout=5)
            self.thread = None
        self.httpd.server_close()
        if self._handler.run is not None:
            self._handler.run.close()
            self._handler.run = None


__all__ = ["RunServer", "PortInUseError", "run_summary", "series_json"]
