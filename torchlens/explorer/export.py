"""One self-contained HTML file of a run: the page, its assets and the run's data inline. It
opens from disk with no server and no network, e.g. to mail a run to a colleague."""
from __future__ import annotations

import json
import os
from typing import Optional

from .data import Catalog
from .server import ASSETS_DIR


def _read(name: str) -> str:
    with open(os.path.join(ASSETS_DIR, name), encoding="utf-8") as f:
        return f.read()


def _inline_script(text: str) -> str:
    return text.replace("</", "<\\/")  # nothing inside may close the <script> element


def export_html(run_dir: str, path: str, run_id: Optional[str] = None) -> str:
    """Write the explorer page of the run at ``run_dir`` to ``path``; returns ``path``.

    Example:
        >>> import os, pathlib, tempfile, torch, torchlens as tl
        >>> from torchlens.explorer import export_html
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
        layouts = {cid: catalog.layout_json(run_id, cid) for cid, call in summary["calls"].items()
                   if call["children"] or cid == ""}
        call_series = {cid: catalog.call_series_json(run_id, cid) for cid in summary["series"]}
    finally:
        catalog.close()
    data = {"summary": summary, "layouts": layouts, "call_series": call_series}
    page = _read("index.html")
    page = page.replace('<link rel="stylesheet" href="/assets/explorer.css">', f"<style>\n{_read('explorer.css')}</style>")
    script = (f"<script>window.TORCHLENS_EXPORT = {_inline_script(json.dumps(data, separators=(',', ':')))};</script>\n"
              f"<script>\n{_inline_script(_read('explorer.js'))}</script>")
    page = page.replace('<script src="/assets/explorer.js"></script>', script)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


__all__ = ["export_html"]
