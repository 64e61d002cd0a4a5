"""The explorer's HTTP server: the page, its assets, and JSON routes over a ``Catalog``.

``tl.watch`` runs it in a separate process (``process.py``), ``torchlens explore`` in a thread
of its own process. It never writes and never waits on training: every answer is read from the
run database. Only the package's own assets and the runs' data are served; any other path is 404.

Who may ask: a request whose ``Host`` is not a name of the served address (``localhost``,
``127.0.0.1``, ``[::1]`` or the ``host`` it was started with) gets 403, so a web page cannot
reach the server by DNS rebinding; a request that is not a read (not GET/HEAD) must carry the
served ``Origin``. Bound to anything but loopback, the server also wants its token: ``?token=``
in the URL it prints, kept in a cookie after the first load.

JSON routes (``run`` is a run id from ``/api/runs``; optional when there is one run):

- ``GET /api/runs``: the runs under the served folder (ids relative to it, no absolute paths).
- ``GET /api/run?run=ID``: model, status, steps, stride, bins, calls, series names per call.
- ``GET /api/poll?run=ID&since=STEP``: steps logged after ``since``, how many steps there are and
  the last, the stride, the status and the number of calls (a page asks this every few seconds).
- ``GET /api/layout?run=ID&call=CALL``: node positions and edge paths of one call's graph.
- ``GET /api/call_series?run=ID&call=CALL[&since=STEP]``: every histogram series of a call,
  only columns ending at or after ``since``.
- ``GET /api/series?run=ID&call=CALL&kind=KIND&name=NAME[&since=STEP]``: one series.
- ``GET /api/pair?run=ID&other=ID[&tolerance=T]``: two runs side by side (``pair.py``): the
  calls only one has, and per series the first step where ``Run.compare`` finds them differ.
- ``GET /api/health?run=ID``: ``run.health()``'s findings and a status line; ``GET
  /run-file?run=ID&name=nonfinite_stepN.html``: the NaN sentinel's page (no other file).
"""

from __future__ import annotations

import errno
import hmac
import json
import logging
import os
import secrets
import socket
import stat
import string
import sys
import threading
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, FrozenSet, Optional, Sequence
from urllib.parse import parse_qs, urlencode, urlparse

from ...errors import TorchlensError
from ...web.embed import ASSETS_DIR
from ..store import TOLERANCE, RunError
from .data import Catalog, NotFound
from .pair import PairCatalog, pair_json

_LOG = logging.getLogger("torchlens.explorer")

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # served without a token
_TOKEN_CHARS = string.ascii_letters + string.digits + "._~-"
_ANY_ADDRESS = ("", "0.0.0.0", "::")  # every interface: any Host may be right, the token guards


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


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port=0``: any free port); a busy port fails here.

    Example:
        >>> s = bind("127.0.0.1", 0)
        >>> s.getsockname()[1] > 0
        True
        >>> s.close()
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=64)
    except OSError as error:
        if error.errno in (errno.EADDRINUSE, errno.EACCES):
            raise PortInUseError(
                error.errno,
                f"torchlens: port {port} on {host} is in use (or not allowed). Pass another "
                f"port, e.g. port={port + 1} (or port=0 for any free port).",
            ) from None
        raise


def default_token(host: str) -> str:
    """The token a server on ``host`` wants: none on loopback, else a fresh random one.

    Example:
        >>> default_token("127.0.0.1"), len(default_token("0.0.0.0")) > 20
        ('', True)
    """
    return "" if host in LOOPBACK else secrets.token_urlsafe(24)


def allowed_hosts(host: str) -> Optional[FrozenSet[str]]:
    """The ``Host`` names a server bound to ``host`` answers (``None``: any, on every interface)."""
    if host in _ANY_ADDRESS:
        return None
    return frozenset({"localhost", "127.0.0.1", "::1", host.strip("[]").lower()})


def host_name(header: Optional[str]) -> Optional[str]:
    """The host part of a ``Host`` header, lowercase, without port or IPv6 brackets; ``None``
    when malformed.

    Example:
        >>> host_name("LocalHost:8080"), host_name("[::1]:80"), host_name("a:b:c")
        ('localhost', '::1', None)
    """
    if not header:
        return None
    value = header.strip().lower()
    if value.startswith("["):
        name, closed, rest = value[1:].partition("]")
        return name if closed and name and (not rest or rest.startswith(":")) else None
    if value.count(":") > 1:
        return None
    return value.split(":", 1)[0].rstrip(".") or None


def server_url(host: str, port: int, token: str = "") -> str:
    """The address to open: ``localhost`` for the loopback address, the token in the query."""
    if host in ("127.0.0.1", "localhost"):
        name = "localhost"
    elif host in _ANY_ADDRESS:
        name = socket.gethostname()  # reachable from elsewhere by this name, if by any
    else:
        name = f"[{host}]" if ":" in host else host
    return f"http://{name}:{port}" + (f"/?token={token}" if token else "")


def _int(query: Dict[str, str], key: str) -> Optional[int]:
    if key not in query:
        return None
    try:
        return int(query[key])
    except ValueError:
        raise BadRequest(f"{key} must be an integer, not {query[key]!r}") from None


def _float(query: Dict[str, str], key: str, default: float) -> float:
    try:
        return float(query.get(key, default))
    except ValueError:
        raise BadRequest(f"{key} must be a number, not {query[key]!r}") from None


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
        "/api/health": lambda q: catalog.health_json(q.get("run")),
        "/api/pair": lambda q: pair_json(catalog, q.get("run"), _need(q, "other"), _float(q, "tolerance", TOLERANCE)),
        "/api/series": lambda q: catalog.series_json(
            q.get("run"), _need(q, "call"), _need(q, "kind"), _need(q, "name"), since=_int(q, "since")
        ),
    }


class _Server(ThreadingHTTPServer):
    """Counts what goes wrong with a connection instead of printing a traceback for each into the
    training process's stderr (a page closed mid-answer, a slow client timing out): logged once."""

    disconnects = 0  # clients gone mid-answer
    failures = 0  # anything else that ended a connection

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            self.disconnects += 1
            if self.disconnects == 1:
                _LOG.info(
                    "torchlens explorer: a client disconnected before its answer was sent (counted, not logged again)"
                )
            return
        self.failures += 1
        if self.failures == 1:
            _LOG.warning(
                "torchlens explorer: a connection failed (%s: %s); later ones are counted, not logged",
                type(error).__name__,
                error,
            )


# a run folder's own pages (the NaN sentinel's): their scripts run in an opaque origin (no
# allow-same-origin), so a page planted in a shared run folder cannot read /api/runs
RUN_FILE_POLICY = "sandbox allow-scripts allow-popups allow-downloads"
MAX_RUN_FILE_BYTES = 256 << 20


class _Handler(BaseHTTPRequestHandler):
    catalog: Catalog
    routes: Dict[str, Callable]
    assets: Dict[str, str]
    hosts: Optional[FrozenSet[str]]  # None: any
    token: str  # "" : none wanted
    cookie: str  # the cookie that keeps the token after the first load

    def log_message(self, format: str, *args: Any) -> None:  # keep training output readable
        pass

    def _send(self, status: int, body: bytes, content_type: str, headers: Optional[Dict[str, str]] = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any, status: int = 200) -> None:
        self._send(status, json.dumps(value, separators=(",", ":")).encode(), "application/json")

    def _refuse(self, why: str) -> None:
        self._send(403, f"torchlens: {why}\n".encode(), _TYPES[".txt"])

    def _public(self, message: str) -> str:
        """An error message without the served folder's absolute path (the page needs none)."""
        root = self.catalog.root
        return message.replace(root + os.sep, "").replace(root, os.path.basename(root) or ".")

    def _allowed(self, query: Dict[str, str]) -> bool:
        """Host, Origin and token checks; answers 403 itself when one fails."""
        host_header = self.headers.get("Host")
        name = host_name(host_header)
        if name is None or (self.hosts is not None and name not in self.hosts):
            self._refuse("unknown Host. Open the explorer at the address it printed.")
            return False
        origin = self.headers.get("Origin")
        # a read from the page itself carries no Origin or its own; anything else must be ours
        if (self.command not in ("GET", "HEAD") or origin is not None) and (
            origin is None or origin.lower() != f"http://{host_header.strip().lower()}"
        ):
            self._refuse("cross-origin request refused.")
            return False
        if self.token and not self._token_ok(query):
            self._refuse("this server needs its token: open the URL it printed (the one with ?token=...).")
            return False
        return True

    def _token_ok(self, query: Dict[str, str]) -> bool:
        given = [query.get("token", "")]
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith(("token ", "bearer ")):
            given.append(auth.split(" ", 1)[1].strip())
        try:
            morsel = SimpleCookie(self.headers.get("Cookie", "")).get(self.cookie)
        except CookieError:
            morsel = None
        if morsel is not None:
            given.append(morsel.value)
        return any(hmac.compare_digest(g.encode(), self.token.encode()) for g in given if g)

    def do_GET(self) -> None:
        try:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            if not self._allowed(query):
                return
            path = url.path
            if path in ("/", "/index.html"):
                if self.token and "token" in query:  # first load: keep the token in a cookie, out of the address bar
                    rest = urlencode({k: v for k, v in query.items() if k != "token"})
                    cookie = f"{self.cookie}={self.token}; Path=/; HttpOnly; SameSite=Lax"
                    return self._send(
                        302,
                        b"",
                        _TYPES[".txt"],
                        {"Location": path + (f"?{rest}" if rest else ""), "Set-Cookie": cookie},
                    )
                return self._file(self.assets["index.html"])
            if path.startswith("/assets/") and path[len("/assets/") :] in self.assets:
                return self._file(self.assets[path[len("/assets/") :]])
            if path == "/run-file":  # the NaN sentinel's operation-level page (health.js links it)
                return self._run_file(self.catalog.report_page(query.get("run"), query.get("name", "")))
            route = self.routes.get(path)
            if route is None:
                return self._json({"error": "not found"}, 404)
            self._json(route(query))
        except (ConnectionError, TimeoutError):
            raise  # the client left: nothing can be answered (counted by the server, see _Server)
        except NotFound as error:
            self._json({"error": self._public(str(error))}, 404)
        except (BadRequest, KeyError, ValueError) as error:
            message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
            self._json({"error": self._public(str(message))}, 400)
        except (RunError, OSError) as error:
            self._json({"error": self._public(str(error))}, 500)
        except Exception as error:  # keep serving whatever happens
            self._json({"error": self._public(f"{type(error).__name__}: {error}")}, 500)

    do_HEAD = do_GET

    def _not_a_read(self) -> None:
        """Nothing is written through this server: refuse foreign origins first, then say so."""
        if self._allowed({}):
            self._send(405, b"torchlens: the explorer only reads.\n", _TYPES[".txt"], {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_a_read

    def _file(self, path: str) -> None:
        with open(path, "rb") as f:
            body = f.read()
        self._send(200, body, _TYPES[os.path.splitext(path)[1]])

    def _run_file(self, path: str) -> None:
        """A page a run folder holds: read without following a link and bounded in size, and
        served sandboxed (``RUN_FILE_POLICY``), so that its scripts run in an origin of their
        own and cannot read the explorer's API (every run it serves)."""
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            raise NotFound(f"this run has no {os.path.basename(path)}") from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise NotFound(f"{os.path.basename(path)} is not a plain file")
            if info.st_size > MAX_RUN_FILE_BYTES:
                raise NotFound(
                    f"{os.path.basename(path)} is larger than any page torchlens writes ({info.st_size} bytes)"
                )
            body = f.read(MAX_RUN_FILE_BYTES + 1)[:MAX_RUN_FILE_BYTES]
        self._send(200, body, _TYPES[".html"], {"Content-Security-Policy": RUN_FILE_POLICY})


class RunServer:
    """Serves the runs under ``root`` on ``host:port`` from a daemon thread until ``close()``.

    The socket is bound in the constructor (a busy port fails at once), or given as ``sock``
    (already listening, e.g. inherited from ``tl.watch``'s process); ``start()`` begins serving,
    and the folder need not hold a run until then. ``runs``: exactly these two run folders
    (``torchlens explore RUN_A RUN_B``) instead of the runs under ``root``. ``token``: ``None`` for the default (none on
    loopback, a random one elsewhere), ``""`` for none.

    Example:
        >>> import tempfile, urllib.request
        >>> server = RunServer(tempfile.mkdtemp(), port=0).start()
        >>> urllib.request.urlopen(server.url + "/api/runs").read()
        b'{"runs":[]}'
        >>> server.close()
    """

    def __init__(
        self,
        root: str,
        host: str = "127.0.0.1",
        port: int = 8080,
        token: Optional[str] = None,
        sock: Optional[socket.socket] = None,
        runs: Optional[Sequence[str]] = None,
    ) -> None:
        self.root = root
        self.runs = PairCatalog(runs) if runs else None  # checked here: a wrong folder fails at once
        self.token = default_token(host) if token is None else token
        if self.token.strip(_TOKEN_CHARS):  # it goes into a URL and a cookie as it is
            raise ValueError(f"the token may hold only letters, digits and '._~-', not {token!r}.")
        sock = bind(host, port) if sock is None else sock
        self.handler: Any = type(
            "Handler",
            (_Handler,),
            {
                "assets": asset_files(),
                "hosts": allowed_hosts(host),
                "token": self.token,
                "cookie": f"torchlens-token-{sock.getsockname()[1]}",  # cookies ignore ports
            },
        )
        self.httpd = _Server(sock.getsockname()[:2], self.handler, bind_and_activate=False)
        self.httpd.socket.close()
        self.httpd.socket = sock
        self.httpd.daemon_threads = True
        self.host, self.port = host, sock.getsockname()[1]
        self.catalog: Optional[Catalog] = None
        self.thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        """The address to open (with ``?token=`` when the server wants one)."""
        return server_url(self.host, self.port, self.token)

    def _ready(self) -> None:
        if self.catalog is None:
            self.catalog = self.runs if self.runs is not None else Catalog(self.root)
            self.handler.catalog = self.catalog
            self.handler.routes = _routes(self.catalog)

    def start(self) -> "RunServer":
        self._ready()
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="torchlens-explorer", daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted or ``shutdown()`` (for ``torchlens explore``)."""
        self._ready()
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


__all__ = ["RunServer", "PortInUseError", "asset_files", "bind", "server_url"]
