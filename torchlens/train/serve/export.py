"""One self-contained HTML file of a run, or of every run of a folder: the page, its assets and
the runs' data inline. It opens from disk with no server and no network, e.g. to mail a run to
a colleague; packed, it is also the explorer shown inline in a notebook (``Watch.show``)."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from ...web.embed import inline_page, packed_page, srcdoc_frame
from ..store import RunError
from .data import Catalog, NotFound


def page_data(catalog: Catalog, run_id: str) -> dict:
    """What the page asks of one run: its summary, the layout of every call with children, the
    series of every call, and its health findings."""
    summary = catalog.summary_json(run_id)
    layouts = {
        cid: catalog.layout_json(run_id, cid) for cid, call in summary["calls"].items() if call["children"] or cid == ""
    }
    call_series = {cid: catalog.call_series_json(run_id, cid) for cid in summary["series"]}
    health = catalog.health_json(run_id)  # the Health panel (health.js reads it from here offline)
    return {"summary": summary, "layouts": layouts, "call_series": call_series, "health": health}


def export_page(run_dir: str, run_id: Optional[str] = None, packed: bool = False) -> str:
    """The explorer page of the run at ``run_dir`` (or of the runs of a folder, see
    ``export_html``) as HTML text; ``packed``: data and scripts gzip-packed and unpacked once on
    screen (``torchlens.web.embed.packed_page``), for notebook outputs.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> from torchlens.train.serve.export import export_page
        >>> model, folder = torch.nn.Linear(2, 2), tempfile.mkdtemp()
        >>> with tl.watch(model, run_dir=folder, backend=None, verbose=False):
        ...     model(torch.ones(1, 2)).sum().backward()
        >>> 'id="tl-packed"' in export_page(folder, packed=True)
        True
    """
    catalog = Catalog(run_dir)
    try:
        ids = catalog.run_ids() if run_id is None else [run_id]
        if not ids:
            raise NotFound(
                f"no torchlens run under {run_dir} (a run folder holds run.db; tl.watch(run_dir=...) writes one)"
            )
        if len(ids) == 1:
            data = page_data(catalog, ids[0])
        else:
            runs = catalog.runs_json()["runs"]
            run_data = {}
            for run in runs:
                try:
                    run_data[run["id"]] = page_data(catalog, run["id"])
                except (RunError, OSError) as error:  # listed as unreadable, as the server does
                    run.setdefault("error", str(error).replace(catalog.root + os.sep, ""))
            data = {"runs": runs, "run_data": run_data}
    finally:
        catalog.close()
    embed = packed_page if packed else inline_page  # every asset inline, data first
    return embed("index.html", data, "TORCHLENS_EXPORT")


def export_html(run_dir: str, path: str, run_id: Optional[str] = None) -> str:
    """Write the explorer page of the run at ``run_dir`` to ``path``; returns ``path``.

    ``run_dir`` may also be a folder of runs: the file then holds every run, with the page's run
    picker (an unreadable run is listed as such), or only ``run_id`` (a folder relative to
    ``run_dir``, as ``Catalog.run_ids`` gives it).

    Example:
        >>> import os, pathlib, tempfile, torch, torchlens as tl
        >>> from torchlens.train.serve import export_html
        >>> model, folder = torch.nn.Linear(2, 2), tempfile.mkdtemp()
        >>> with tl.watch(model, run_dir=folder, backend=None, verbose=False):
        ...     model(torch.ones(1, 2)).sum().backward()
        >>> page = export_html(folder, os.path.join(folder, "page.html"))
        >>> 'TORCHLENS_EXPORT' in pathlib.Path(page).read_text()
        True
    """
    page = export_page(run_dir, run_id)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def notebook_html(run_dir: str, height: int = 640) -> str:
    """The explorer of the run at ``run_dir`` as a notebook output: a snapshot of the steps written
    so far (a watch writes a step when the next one starts, or at ``close()``), packed into a
    sandboxed iframe that needs no server and no network, so it works on a remote kernel too and
    stays in the saved notebook.

    Example:
        >>> import tempfile, torch, torchlens as tl
        >>> model, folder = torch.nn.Linear(2, 2), tempfile.mkdtemp()
        >>> with tl.watch(model, run_dir=folder, backend=None, verbose=False):
        ...     model(torch.ones(1, 2)).sum().backward()
        >>> notebook_html(folder, height=400).startswith("<iframe srcdoc=")
        True
    """
    return srcdoc_frame(export_page(run_dir, packed=True), height)


def show_inline(run_dir: str, height: int = 640) -> Any:
    """Display ``notebook_html(run_dir, height)`` in the running Jupyter kernel (returns the
    IPython ``HTML`` object); outside one, raise ``RuntimeError`` naming the alternatives."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:
        raise RuntimeError(
            f"show() displays the explorer in a Jupyter notebook; elsewhere run `torchlens explore {run_dir}` "
            f"or write one file with torchlens.train.serve.export_html({run_dir!r}, 'run.html')."
        )
    from IPython.display import HTML, display

    shown = HTML(notebook_html(run_dir, height))
    display(shown)
    return shown


__all__ = ["export_html", "export_page", "notebook_html", "page_data", "show_inline"]
