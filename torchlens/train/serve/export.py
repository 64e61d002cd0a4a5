"""One self-contained HTML file of a run, or of every run of a folder: the page, its assets and
the runs' data inline. It opens from disk with no server and no network, e.g. to mail a run to
a colleague."""

from __future__ import annotations

import os
from typing import Optional

from ...web.embed import inline_page
from ..reader import RunError
from .data import Catalog, NotFound


def _run_data(catalog: Catalog, run_id: str) -> dict:
    """What the page asks of one run: its summary, the layout of every call with children, and
    the series of every call."""
    summary = catalog.summary_json(run_id)
    layouts = {
        cid: catalog.layout_json(run_id, cid) for cid, call in summary["calls"].items() if call["children"] or cid == ""
    }
    call_series = {cid: catalog.call_series_json(run_id, cid) for cid in summary["series"]}
    return {"summary": summary, "layouts": layouts, "call_series": call_series}


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
    catalog = Catalog(run_dir)
    try:
        ids = catalog.run_ids() if run_id is None else [run_id]
        if not ids:
            raise NotFound(
                f"no torchlens run under {run_dir} (a run folder holds run.db; tl.watch(run_dir=...) writes one)"
            )
        if len(ids) == 1:
            data = _run_data(catalog, ids[0])
        else:
            runs = catalog.runs_json()["runs"]
            run_data = {}
            for run in runs:
                try:
                    run_data[run["id"]] = _run_data(catalog, run["id"])
                except (RunError, OSError) as error:  # listed as unreadable, as the server does
                    run.setdefault("error", str(error).replace(catalog.root + os.sep, ""))
            data = {"runs": runs, "run_data": run_data}
    finally:
        catalog.close()
    page = inline_page("index.html", data, "TORCHLENS_EXPORT")  # every asset inline, data first
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


__all__ = ["export_html"]
