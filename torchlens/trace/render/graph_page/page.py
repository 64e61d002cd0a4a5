"""The interactive graph page of a ``ModelHistory``: one self-contained HTML file (assets and
data inline, no server, no network). Its inline display in Jupyter is ``inline.py``."""

from __future__ import annotations

import html as _html
import os
from typing import TYPE_CHECKING, Any, Optional

from ....web.embed import inline_page, srcdoc_frame
from .data import page_data

if TYPE_CHECKING:
    from ...history.model_history import ModelHistory


def to_html(
    history: "ModelHistory", path: Optional[str] = None, overlay: Any = None, focus: Optional[str] = None
) -> str:
    """The page as HTML text; with ``path`` also written there (``.html`` is not added); with
    ``overlay`` nodes coloured by a value per label, with ``focus`` opened on that operation.

    Example:
        >>> import torch, torchlens as tl
        >>> from torchlens.trace.render.graph_page import to_html
        >>> h = tl.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2), random_seed=0)
        >>> page = to_html(h)
        >>> page.startswith("<!doctype html>") and "linear_1_1" in page and "/assets/" not in page
        True
    """
    page = inline_page("graph.html", page_data(history, overlay, focus), "TORCHLENS_GRAPH")
    page = page.replace(
        "<title>torchlens graph</title>", f"<title>{_html.escape(history.model_name)} · torchlens graph</title>"
    )
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    return page


def iframe_html(page: str, height: int = 640) -> str:
    """An ``<iframe>`` holding ``page`` in its ``srcdoc`` (isolated from the notebook page).

    Example:
        >>> iframe_html("<p>a & b</p>", height=100)[:80]
        '<iframe srcdoc="&lt;p&gt;a &amp; b&lt;/p&gt;" style="width: 100%; height: 100px;'
    """
    return srcdoc_frame(page, height)


__all__ = ["to_html", "iframe_html"]
