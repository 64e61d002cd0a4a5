"""One self-contained HTML file of a run: the page, its assets and the run's data inline. It
opens from disk with no server and no network, e.g. to mail a run to a colleague."""

from __future__ import annotations

from typing import Optional

from ...web.embed import inline_page
from .data import Catalog


def export_html(run_dir: str, path: str, run_id: Optional[str] = None) -> str:
    """Write the explorer page of the run at ``run_dir`` to ``path``; returns ``path``.

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
        summary = catalog.summary_json(run_id)
        layouts = {
            cid: catalog.layout_json(run_id, cid)
            for cid, call in summary["calls"].items()
            if call["children"] or cid == ""
        }
        call_series = {cid: catalog.call_series_json(run_id, cid) for cid in summary["series"]}
    finally:
        catalog.close()
    data = {"summary": summary, "layouts": layouts, "call_series": call_series}
    page = inline_page("index.html", data, "TORCHLENS_EXPORT")  # every asset inline, data first
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


__all__ = ["export_html"]
