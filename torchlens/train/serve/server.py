"""The explorer's HTTP server: the page, its assets, and JSON routes over a ``Catalog``.

Runs in a daemon thread (of the training process under ``tl.watch``, or of ``torchlens
explore``). It never writes and never waits on training: every answer is read from the run
database. Only the package's own assets and the runs' data are served; any other path is 404.

JSON routes (``run`` is a run id from ``/api/runs``; optional when there is one run):

- ``GET /api/runs``: the runs under the served folder.
- ``GET /api/run?run=ID``: model, status, steps, stride, bins, calls, series names per call.
- ``GET /api/poll?run=ID&since=STEP``: steps logged after ``since``, the stride, the status and
  the number of calls (a page asks this every few seconds; it is small).
- ``GET /api/layout?run=ID&call=CALL``: node positions and edge paths of one call's graph.
- ``GET /api/call_series?run=ID&call=CALL[&since=STEP]``: every histogram series of a call,
  only columns ending at or after ``since``.
- ``GET /api/series?run=ID&call=CALL&kind=KIND&name=NAME[&since=STEP]``: one series.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional
from urllib.parse import parse_qs, urlparse

from ...errors import TorchlensError
from ...web.embed import ASSETS_DIR
from ..reader import RunError
from .data import Catalog, NotFound

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}


class PortInUseError(TorchlensError, OSError):
    """The port asked for is taken by another program."""


class BadRequest(TorchlensError, ValueError):
    """A malformed query (400)."""


def asset_files() -> Dict[str, str]:
    """The servable assets: file name -> path (a fixed list, so no path can escape it)."""
    return {
        name: os.path.join(ASSETS_DIR, name)
        for name in sorted(os.listdir(ASSETS_DIR))
        if os.path.splitext(name)[1] in _TYPES
    }


def _int(query: Dict[str, str], key: str) -> Optional[int]:
    if key not in query:
        return None
    try:
        return int(query[key])
    except ValueError:
        raise BadRequest(f"{key} must be an integer, not {query[key]!r}") from None


def _need(query: Dict[str, str], key: str) -> str:
    if key not in query:
        raise BadRequest(f"missing query parameter {key!r}")
    return query[key]


def _routes(catalog: Catalog) -> Dict[str, Callable[[Dict[str, str]], Any]]:
    return {
        "/api/runs": lambda q: catalog.runs_json(),
        "/api/run": lambda q: catalog.summary_json(q.get("run")),
        "/api/poll": lambda q: catalog.poll_json(q.get("run"), _int(q, "since") if "since" in q else -1),
        "/api/layout": lambda q: catalog.layout_json(q.get("run"), _need(q, "call")),
        "/api/call_series": lambda q: catalog.call_series_json(q.get("run"), _need(q, "call"), _int(q, "since")),
        "/api/series": lambda q: catalog.series_json(
            q.get("run"), _need(q, "call"), _need(q, "kind"), _need(q, "name"), since=_int(q, "since")
        ),
    }


class _Handler(BaseHTTPRequestHandler):
    catalog: Catalog
    routes: Dict[str, Callable]
    assets: Dict[str, str]

    def log_message(self, format: str, *args: Any) -> None:  # keep training output readable
        pass

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any, status: int = 200) -> None:
        self._send(status, json.dumps(value, separators=(",", ":")).encode(), "application/json")

    def do_GET(self) -> None:
        try:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            path = url.path
            if path in ("/", "/index.html"):
                return self._file(self.assets["index.html"])
            if path.startswith("/assets/") and path[len("/assets/") :] in self.assets:
                return self._file(self.assets[path[len("/assets/") :]])
            route = self.routes.get(path)
            if route is None:
                return self._json({"error": "not found"}, 404)
            self._json(route(query))
        except NotFound as error:
            self._json({"error": str(error)}, 404)
        except (BadRequest, KeyError, ValueError) as error:
            message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
            self._json({"error": message}, 400)
        except (RunError, OSError) as error:
            self._json({"error": str(error)}, 500)
        except Exception as error:  # keep serving whatever happens
            self._json({"error": f"{type(error).__name__}: {error}"}, 500)

    def _file(self, path: str) -> None:
        with open(path, "rb") as f:
            body = f.read()
        self._send(200, body, _TYPES[os.path.splitext(path)[1]])


class RunServer:
    """Serves the runs under ``root`` on ``host:port`` from a daemon thread until ``close()``.

    The socket is bound in the constructor (a busy port fails at once); ``start()`` begins
    serving, and the folder need not hold a run until then.
    """

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 8080) -> None:
        self.root = root
        self.handler = type("Handler", (_Handler,), {"assets": asset_files()})
        try:
            self.httpd = ThreadingHTTPServer((host, port), self.handler)
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUseError(
                    error.errno,
                    f"torchlens: port {port} on {host} is in use (or not allowed). Pass another "
                    f"port, e.g. port={port + 1} (or port=0 for any free port).",
                ) from None
            raise
        self.httpd.daemon_threads = True
        self.host, self.port = host, self.httpd.server_address[1]
        self.catalog: Optional[Catalog] = None
        self.thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        host = "localhost" if self.host in ("127.0.0.1", "localhost") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> "RunServer":
        self.catalog = Catalog(self.root)
        self.handler.catalog = self.catalog
        self.handler.routes = _routes(self.catalog)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="torchlens-explorer", daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (for ``torchlens explore``)."""
        if self.catalog is None:
            self.catalog = Catalog(self.root)
            self.handler.catalog = self.catalog
            self.handler.routes = _routes(self.catalog)
        try:
            self.httpd.serve_forever()
        finally:
            self.close()

    def close(self) -> None:
        if self.thread is not None:
            self.httpd.shutdown()
            self.thread.join(timeout=5)
            self.thread = None
        self.httpd.server_close()
        if self.catalog is not None:
            self.catalog.close()
            self.catalog = None


__all__ = ["RunServer", "PortInUseError", "asset_files"]
