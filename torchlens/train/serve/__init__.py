"""The explorer page of watched runs: served live by ``tl.watch``, after training by
``torchlens explore RUN_DIR``, or written to one self-contained file (``export_html``)."""

from typing import Optional

from .data import Catalog, NotFound
from .export import export_html, notebook_html, page_data, show_inline
from .process import ServingProcess
from .server import PortInUseError, RunServer


def explore(
    root: str,
    port: int = 8080,
    host: str = "127.0.0.1",
    block: bool = True,
    token: Optional[str] = None,
    other: Optional[str] = None,
) -> RunServer:
    """Serve the run (or folder of runs) at ``root`` on ``http://host:port``; with ``other`` (a
    second run folder), the two runs side by side: the page opens ``root`` compared with ``other``.

    With ``block=True`` (the command line) it serves until interrupted; otherwise it returns the
    started server (``server.url``, ``server.close()``). Bound to anything but loopback the
    server wants a token (``token``, default a random one), given in the URL it prints.
    """
    server = RunServer(root, host=host, port=port, token=token, runs=[root, other] if other else None)
    if block:
        what = f"{root} and {other} side by side" if other else root
        print(f"torchlens: serving {what} at {server.url} (Ctrl-C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        return server
    return server.start()


__all__ = [
    "explore",
    "export_html",
    "notebook_html",
    "show_inline",
    "page_data",
    "Catalog",
    "NotFound",
    "RunServer",
    "ServingProcess",
    "PortInUseError",
]
